"""Text for ``siirl-train --help [GROUP]``, generated from the schema's docstrings and field
help (its lists of names read from their registries now: ``siirl.params.listed_names``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from siirl.errors import ConfigError
from siirl.params import SiiRLArguments
from siirl.params.key_support import help_tag
from siirl.params.listed_names import field_help


def _doc(obj: Any) -> str:
    """The first paragraph of a schema class's docstring, as one line (a builtin's
    docstring, e.g. dict's, is not the schema's and is never shown)."""
    doc = obj.__doc__ if dataclasses.is_dataclass(obj) else None
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def _summary(f: dataclasses.Field) -> str:
    """A top-level field's line: its group's docstring, or the field's own help (a
    free-form dict such as custom_envs)."""
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return _doc(value)
    return field_help(f)


def _free_form(path: str) -> dataclasses.Field | None:
    """The schema field ``path`` names when it is a free-form dict (custom_envs), else None."""
    parent, _, name = path.rpartition(".")
    node: Any = SiiRLArguments()
    for part in [p for p in parent.split(".") if p]:
        node = getattr(node, part, None)
    if not dataclasses.is_dataclass(node):
        return None
    fields = {f.name: f for f in dataclasses.fields(node)}
    field = fields.get(name)
    return field if field is not None and isinstance(getattr(node, name), dict) else None


def _free_form_help(path: str, f: dataclasses.Field) -> str:
    lines = [f"{path}: {field_help(f) or 'a free-form dict'}"]
    entries = f.metadata.get("entries", {})
    if entries:
        lines.append("  each entry holds:")
        lines += [f"    {key:<34} {text}" for key, text in entries.items()]
    if f.metadata.get("example"):
        lines.append(f"  e.g. siirl-train {f.metadata['example']}")
    return "\n".join(lines)


def _group(path: str):
    node: Any = SiiRLArguments()
    for part in [p for p in path.split(".") if p]:
        if not dataclasses.is_dataclass(node) or not hasattr(node, part):
            from siirl.params.parser import suggest
            from siirl.params.provided_sections import absent_section_problem

            raise ConfigError(absent_section_problem(path) or
                              f"unknown config group '{path}'{suggest(path)}")
        node = getattr(node, part)
    if not dataclasses.is_dataclass(node):
        raise ConfigError(f"'{path}' is a key, not a group; see siirl-train --help "
                          f"{path.rsplit('.', 1)[0] if '.' in path else ''}".rstrip())
    return node


def format_help(path: str = "") -> str:
    if not path:
        lines = ["", "configuration groups (siirl-train --help GROUP lists its keys):"]
        for f in dataclasses.fields(SiiRLArguments):
            lines.append(f"  {f.name:<24} {_summary(f)}")
        return "\n".join(lines)
    free_form = _free_form(path)
    if free_form is not None:
        return _free_form_help(path, free_form)
    node = _group(path)
    lines = [f"{path}: {_doc(node)}"]
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            lines.append(f"  {f.name + '.':<36} (group) {_doc(value)}")
            continue
        text = " ".join(t for t in (field_help(f), help_tag(f"{path}.{f.name}")) if t)
        lines.append(f"  {f.name:<36} = {value!r}" + (f"   # {text}" if text else ""))
    return "\n".join(lines)
