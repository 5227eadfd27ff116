"""verl's stateful tools, one instance per conversation.

A verl (and siiRL) ``BaseTool`` keeps state per trajectory: ``create(instance_id=None,
**create_kwargs) -> instance_id`` when the conversation starts (newer verl returns
``(instance_id, response)``), ``execute(instance_id, parameters) -> (text, reward, metrics)``
per call, ``release(instance_id)`` at the end; any of them may be a coroutine. The
``create_kwargs`` come from the prompt row: ``extra_info.tools_kwargs.<tool name>.create_kwargs``
(e.g. GSM8K's ground truth), as verl's datasets write them. A tool whose ``create`` fails
answers its calls with the error; the conversation goes on.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Dict, List, Mapping, Optional


def settle(result: Any) -> Any:
    """The value of a plain result or of a coroutine."""
    if inspect.isawaitable(result):
        async def wait() -> Any:
            return await result
        return asyncio.run(wait())
    return result


def is_stateful(tool: Any) -> bool:
    return callable(getattr(tool, "create", None)) and callable(getattr(tool, "release", None))


class ToolInstances:
    """The instances one conversation holds of the run's stateful tools."""

    def __init__(self, tools: Mapping[str, Any], extra_info: Any = None):
        kwargs_by_tool = (extra_info or {}).get("tools_kwargs") or {} \
            if isinstance(extra_info, Mapping) else {}
        self.tools = {name: tool for name, tool in tools.items() if is_stateful(tool)}
        self.ids: Dict[str, Any] = {}
        self.errors: Dict[str, str] = {}
        self.rewards: List[float] = []  # the step rewards the tools returned
        for name, tool in self.tools.items():
            create_kwargs = dict((kwargs_by_tool.get(name) or {}).get("create_kwargs") or {})
            try:
                created = settle(tool.create(**create_kwargs))
            except Exception as exc:  # its calls answer with the error instead
                self.errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            self.ids[name] = created[0] if isinstance(created, tuple) else created

    def execute(self, name: str, arguments: Dict[str, Any]) -> Any:
        if name in self.errors:
            raise RuntimeError(f"the tool could not start: {self.errors[name]}")
        result = settle(self.tools[name].execute(self.ids[name], arguments))
        if isinstance(result, tuple) and len(result) > 1 and result[1] is not None:
            self.rewards.append(float(result[1]))
        return result

    def close(self) -> Optional[str]:
        """Release every instance; the first error, if one failed."""
        failed = None
        for name, instance_id in self.ids.items():
            try:
                settle(self.tools[name].release(instance_id))
            except Exception as exc:
                failed = failed or f"{name}: {type(exc).__name__}: {exc}"
        self.ids = {}
        return failed
