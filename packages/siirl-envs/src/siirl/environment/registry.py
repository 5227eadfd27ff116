"""Environments by name, through the ``siirl.environments`` entry-point group.

A package registers its own environment in its ``pyproject.toml``::

    [project.entry-points."siirl.environments"]
    my_game = "my_package.game:MyGame"

and a config names it (ROLL's ``custom_envs``)::

    custom_envs:
      SimpleSokoban:            # the tag: metrics and val/train splits group by it
        env_type: sokoban
        env_config: {dim_room: [6, 6], num_boxes: 1}
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, Mapping, Optional

from siirl.environment.base import TextEnv
from siirl.errors import ConfigError
from siirl.plugins import load_plugin

GROUP = "siirl.environments"


def env_class(name: str, what: Optional[str] = None) -> type:
    """The class registered as ``name``; a clear error lists the registered ones."""
    cls = load_plugin(GROUP, str(name), what)
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)) and not callable(cls):
        raise ConfigError(f"environment '{name}' is registered as {cls!r}, which is not a "
                          "TextEnv class or factory")
    return cls


def make_env(name: str, settings: Optional[Mapping[str, Any]] = None,
             what: Optional[str] = None) -> TextEnv:
    """An instance of environment ``name`` built with ``settings``; an unknown setting is
    a ConfigError naming it and the settings the environment takes."""
    cls = env_class(name, what)
    settings = dict(settings or {})
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        signature = None
    if signature is not None and not any(p.kind == p.VAR_KEYWORD
                                         for p in signature.parameters.values()):
        accepted = [p for p in signature.parameters if p != "self"]
        unknown = sorted(set(settings) - set(accepted))
        if unknown:
            where = f"{what}: " if what else ""
            raise ConfigError(f"{where}environment '{name}' has no setting "
                              f"{', '.join(map(repr, unknown))}; it takes: "
                              f"{', '.join(accepted) or 'none'}")
    return cls(**settings)


def envs_from_config(custom_envs: Mapping[str, Any]) -> Dict[str, TextEnv]:
    """``{tag: environment}`` for a ``custom_envs`` mapping (one instance per tag)."""
    made = {}
    for tag, entry in (custom_envs or {}).items():
        if not isinstance(entry, Mapping) or "env_type" not in entry:
            raise ConfigError(f"custom_envs.{tag} needs an env_type (a name in "
                              f"'{GROUP}')")
        made[tag] = make_env(entry["env_type"], entry.get("env_config"),
                             f"custom_envs.{tag}.env_type")
    return made
