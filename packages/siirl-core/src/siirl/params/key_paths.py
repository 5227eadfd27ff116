"""Reading a key of the typed configuration by its dotted name.

The checks that run after parsing (value ranges, relations between keys, the key table,
what this machine lacks) take the typed ``SiiRLArguments`` object. Where a key is fixed
they read attributes; where the key comes from a table (the key rules name keys by their
dotted path, as users type them), ``value_at`` walks the same attributes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


def value_at(args: Any, key: str, default: Any = None) -> Any:
    """The value of the dotted ``key`` in ``args``: section dataclasses by attribute,
    free-form dicts by item; ``default`` where the path does not exist (a None value is
    returned as None)."""
    node = args
    for part in key.split("."):
        if isinstance(node, Mapping):
            if part not in node:
                return default
            node = node[part]
        elif dataclasses.is_dataclass(node) and hasattr(node, part):
            node = getattr(node, part)
        else:
            return default
    return node
