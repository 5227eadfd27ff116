"""A name -> function table for algorithm pieces chosen by a config key.

A registry may start with built-in entries given as ``"module:attribute"`` references, as
Python entry points are: the names are known without importing anything (the validation
pass of ``siirl-train`` lists them before torch loads), and the module is imported when a
name is first looked up.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Mapping, Optional

from siirl.errors import ConfigError


class NameRegistry:
    """``register(*names)`` decorates; ``get(name)`` fails naming the config key and listing
    what is registered, so an unknown estimator or loss stops the run at start-up."""

    def __init__(self, config_key: str, what: str,
                 builtins: Optional[Mapping[str, str]] = None):
        self.config_key = config_key
        self.what = what
        self._entries: Dict[str, Any] = {}
        self._builtins: Dict[str, str] = dict(builtins or {})  # name -> "module:attribute"

    def _resolve(self, name: str) -> None:
        """Import the built-in ``name`` refers to, the first time it is needed."""
        reference = self._builtins.get(name)
        if reference is not None:
            module, attribute = reference.split(":")
            self._entries[name] = getattr(importlib.import_module(module), attribute)
            del self._builtins[name]

    def register(self, *names: str) -> Callable[[Any], Any]:
        def decorate(obj: Any) -> Any:
            for name in names:
                self._resolve(name)
                current = self._entries.get(name)
                if current is not None and current is not obj:
                    raise ValueError(f"{self.what} '{name}' is already registered")
                self._entries[name] = obj
            return obj

        return decorate

    def add(self, name: str, obj: Any) -> None:
        self.register(name)(obj)

    def get(self, name: Any, hint: str = "") -> Any:
        key = getattr(name, "value", name)  # accept enum members
        self._resolve(key)
        if key not in self._entries:
            raise ConfigError(f"{self.config_key}={key!r} is not a registered {self.what}; "
                              f"registered: {', '.join(self.names())}{hint}")
        return self._entries[key]

    def names(self) -> List[str]:
        return sorted({*self._entries, *self._builtins})

    def __contains__(self, name: str) -> bool:
        return name in self._entries or name in self._builtins
