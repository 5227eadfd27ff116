"""Reward managers by name: the plugin registry's ``siirl.reward_managers`` group.

The built-in managers are siirl-engine's entry points in that group (its pyproject.toml),
the one list of their names; ``register`` adds a manager for this process (tests,
notebooks) and ``get_reward_manager_cls`` looks a name up in the same group, so code that
picks a manager by name sees what ``reward_model.reward_manager`` does.
"""

from __future__ import annotations

from typing import Callable

from siirl.plugins import load_plugin
from siirl.plugins import register as register_plugin

GROUP = "siirl.reward_managers"


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make the manager available under ``name`` in this process."""
    return register_plugin(GROUP, name)


def get_reward_manager_cls(name: str) -> type:
    """The manager class ``name`` names (PluginNotFoundError listing the installed ones)."""
    return load_plugin(GROUP, name, what="reward_model.reward_manager")
