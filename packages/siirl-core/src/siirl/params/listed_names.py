"""The names a key may take, as ``siirl-train --help`` lists them: read from their registries
when the help is printed, never copied into the schema, so a name a plugin or user code
registers shows with no edit in ``siirl.params``.

A schema field names where its names come from in its metadata (``"names"``: one of the
sources below) and marks where its help puts them: ``{names}`` (``a, b, c``) or
``{names_or}`` (``a, b or c``)::

    strategy: str = field(default="fsdp", metadata={
        "help": "Training backend: {names_or}.", "names": plugin_group("siirl.engines")})
"""

from __future__ import annotations

import dataclasses
from typing import List, Tuple

Source = Tuple[str, str]


def plugin_group(group: str) -> Source:
    """The names installed in an entry-point group (``siirl.plugins.available``)."""
    return ("plugin_group", group)


def algorithm_registry(name: str) -> Source:
    """The names of a registry in ``siirl.dag_worker.core_algos.names`` (``ADV_ESTIMATORS``...)."""
    return ("algorithm_registry", name)


def section_table(table: str) -> Source:
    """A name table of the installed config sections (``ConfigSection.names``)."""
    return ("section_table", table)


def names_of(source: Source) -> List[str]:
    kind, what = source
    if kind == "plugin_group":
        from siirl.plugins import available

        return available(what)
    if kind == "algorithm_registry":
        from siirl.dag_worker.core_algos import names

        return getattr(names, what).names()
    if kind == "section_table":
        from siirl.params.sections import installed_names

        return installed_names(what)
    raise ValueError(f"unknown source of names {source!r}")


def _joined(names: List[str], last: str) -> str:
    if not names:
        return "none installed"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])}{last}{names[-1]}"


def field_help(f: dataclasses.Field) -> str:
    """``f``'s help text, its ``{names}`` / ``{names_or}`` filled from its source now."""
    text = f.metadata.get("help", "")
    source = f.metadata.get("names")
    if source is None:
        return text
    names = names_of(source)
    return text.replace("{names_or}", _joined(names, " or ")).replace(
        "{names}", _joined(names, ", "))
