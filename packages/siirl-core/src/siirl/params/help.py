"""Text for ``siirl-train --help [GROUP]``, generated from the schema's docstrings."""

from __future__ import annotations

import dataclasses
from typing import Any

from siirl.errors import ConfigError
from siirl.params import SiiRLArguments
from siirl.params.key_support import help_tag


def _doc(obj: Any) -> str:
    return (obj.__doc__ or "").strip().splitlines()[0] if obj.__doc__ else ""


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _group(path: str):
    node: Any = SiiRLArguments()
    for part in [p for p in path.split(".") if p]:
        if not dataclasses.is_dataclass(node) or not hasattr(node, part):
            from siirl.params.parser import suggest
            raise ConfigError(f"unknown config group '{path}'{suggest(path)}")
        node = getattr(node, part)
    if not dataclasses.is_dataclass(node):
        raise ConfigError(f"'{path}' is a key, not a group; see siirl-train --help "
                          f"{path.rsplit('.', 1)[0] if '.' in path else ''}".rstrip())
    return node


def format_help(path: str = "") -> str:
    if not path:
        lines = ["", "configuration groups (siirl-train --help GROUP lists its keys):"]
        for f in dataclasses.fields(SiiRLArguments):
            lines.append(f"  {f.name:<24} {_doc(_default(f))}")
        return "\n".join(lines)
    node = _group(path)
    lines = [f"{path}: {_doc(node)}"]
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            lines.append(f"  {f.name + '.':<36} (group) {_doc(value)}")
            continue
        text = " ".join(t for t in (f.metadata.get("help", ""),
                                    help_tag(f"{path}.{f.name}")) if t)
        lines.append(f"  {f.name:<36} = {value!r}" + (f"   # {text}" if text else ""))
    return "\n".join(lines)
