"""Tool calls in an assistant reply, and tool results cut to size.

``rollout.multi_turn.format`` names the reply format. ``hermes`` (verl's default, what
Qwen2.5/3 and many others are trained on) is a JSON object per call between tags::

    <tool_call>{"name": "python", "arguments": {"code": "print(2**10)"}}</tool_call>

``arguments`` may also be a JSON string holding the object (some models write it so). A
call that cannot be read (bad JSON, no name, arguments not an object) is not dropped: it
comes back as an error the agent sees as the tool's answer, so it can fix its format.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from siirl.errors import ConfigError

FORMATS = ("hermes",)
_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: Dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None  # set when the call could not be read


def check_format(name: str) -> str:
    name = str(name or "hermes").lower()
    if name not in FORMATS:
        raise ConfigError(f"rollout.multi_turn.format={name!r} is not supported; formats: "
                         f"{', '.join(FORMATS)}")
    return name


def _hermes_call(body: str) -> ToolCall:
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return ToolCall("", error=f"the tool call is not valid JSON ({exc.msg}): "
                                  f"{body.strip()[:200]!r}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCall("", error='a tool call needs {"name": ..., "arguments": {...}}, '
                                  f"got {body.strip()[:200]!r}")
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolCall(obj["name"], error=f"the arguments of {obj['name']} are not "
                                               f"valid JSON ({exc.msg})")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolCall(obj["name"], error=f"the arguments of {obj['name']} must be a JSON "
                                           f"object, got {type(arguments).__name__}")
    return ToolCall(obj["name"], dict(arguments))


def parse_tool_calls(text: str, fmt: str = "hermes") -> List[ToolCall]:
    """The tool calls in ``text``, in order (none: the reply is a final answer)."""
    check_format(fmt)
    return [_hermes_call(body) for body in _HERMES.findall(text or "")]


def truncate(text: str, limit: int, side: str = "middle") -> Tuple[str, bool]:
    """``text`` cut to ``limit`` characters (verl's ``tool_response_truncate_side``:
    keep the ``left`` part, the ``right`` part, or both ends around a marker)."""
    if limit <= 0 or len(text) <= limit:
        return text, False
    marker = "...(truncated)..."
    if side == "left":
        return text[:limit] + "...(truncated)", True
    if side == "right":
        return "(truncated)..." + text[-limit:], True
    half = max(limit // 2, 1)
    return text[:half] + marker + text[-half:], True
