"""Reward managers by name.

The entry points in ``siirl.reward_managers`` name the classes directly; this registry
is for code that picks a manager by name without going through the plugin system
(tests, the DAPO/embodied managers built on these ones).
"""

from __future__ import annotations

import importlib
from typing import Callable, Dict

from siirl.errors import ConfigError

_MANAGERS: Dict[str, type] = {}
# Modules whose import registers the built-in names; imported on first lookup only, so
# the registry itself stays cheap to import.
_BUILTIN_MODULES = ("naive", "batch", "parallel")


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make the manager available as ``get_reward_manager_cls(name)``."""

    def decorate(cls: type) -> type:
        current = _MANAGERS.get(name)
        if current is not None and current is not cls:
            raise ConfigError(f"reward manager '{name}' is already registered "
                              f"({current.__module__}.{current.__qualname__})")
        _MANAGERS[name] = cls
        return cls

    return decorate


def get_reward_manager_cls(name: str) -> type:
    if name not in _MANAGERS:
        for module in _BUILTIN_MODULES:
            importlib.import_module(f"siirl.engine.reward_manager.{module}")
    if name not in _MANAGERS:
        raise ConfigError(f"unknown reward manager '{name}' (reward_model.reward_manager); "
                          f"known: {', '.join(sorted(_MANAGERS))}")
    return _MANAGERS[name]
