"""A name -> function table for algorithm pieces chosen by a config key."""

from __future__ import annotations

from typing import Any, Callable, Dict, List

from siirl.errors import ConfigError


class NameRegistry:
    """``register(*names)`` decorates; ``get(name)`` fails naming the config key and listing
    what is registered, so an unknown estimator or loss stops the run at start-up."""

    def __init__(self, config_key: str, what: str):
        self.config_key = config_key
        self.what = what
        self._entries: Dict[str, Any] = {}

    def register(self, *names: str) -> Callable[[Any], Any]:
        def decorate(obj: Any) -> Any:
            for name in names:
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
        if key not in self._entries:
            raise ConfigError(f"{self.config_key}={key!r} is not a registered {self.what}; "
                              f"registered: {', '.join(self.names())}{hint}")
        return self._entries[key]

    def names(self) -> List[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries
