"""The one environment registry: text and embodied environments by name, through the
``siirl.environments`` entry-point group.

A package registers its own environment in its ``pyproject.toml``::

    [project.entry-points."siirl.environments"]
    my_game = "my_package.game:MyGame"        # a TextEnv (agentic) ...
    my_sim = "my_package.sim:MySimEnv"        # ... or an EmbodiedEnv subclass or factory

and a config names it (ROLL's ``custom_envs`` for text environments)::

    custom_envs:
      SimpleSokoban:            # the tag: metrics and val/train splits group by it
        env_type: sokoban
        env_config: {dim_room: [6, 6], num_boxes: 1}

The built-in simulators (``BUILTIN``) are found even where the distribution's entry points
are stale, as in a source checkout. ``make_env`` (text) and
:func:`siirl.environment.embodied.registry.make_embodied_env` both look names up here; they
stay two calls because the two APIs differ, so asking one for the other's kind is a clear
error, not a confusing failure later.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Dict, List, Mapping, Optional

from siirl.environment.base import TextEnv
from siirl.errors import ConfigError
from siirl.plugins import available, load_plugin

GROUP = "siirl.environments"
BUILTIN = {"reach": "siirl.environment.embodied.tasks.reach2d:Reach2D",
           # imported only when asked for: they need their extras (and a renderer)
           "robosuite": "siirl.environment.embodied.adapters.robosuite:RobosuiteEnv",
           "libero": "siirl.environment.embodied.adapters.libero:LiberoEnv"}


def environment_names() -> List[str]:
    """The built-in names, then every name registered in the group (text and embodied:
    which kind a name is shows only once it is imported)."""
    return list(BUILTIN) + [n for n in available(GROUP) if n not in BUILTIN]


def registered(name: str) -> bool:
    return str(name) in BUILTIN or str(name) in available(GROUP)


def lookup(name: str, what: Optional[str] = None) -> Any:
    """The class or factory registered as ``name`` (built in, then the entry points); an
    unknown name is load_plugin's error, which lists the registered ones."""
    name = str(name)
    if name in BUILTIN:
        module, _, attr = BUILTIN[name].partition(":")
        return getattr(importlib.import_module(module), attr)
    return load_plugin(GROUP, name, what)


def checked_settings(cls: Any, name: str, settings: Optional[Mapping[str, Any]],
                     what: Optional[str] = None, kind: str = "") -> Dict[str, Any]:
    """``settings`` as keyword arguments of ``cls``; an unknown one is a ConfigError naming
    it and the settings the environment takes."""
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
            raise ConfigError(f"{where}{kind}environment '{name}' has no setting "
                              f"{', '.join(map(repr, unknown))}; it takes: "
                              f"{', '.join(accepted) or 'none'}")
    return settings


def env_class(name: str, what: Optional[str] = None) -> type:
    """The text environment registered as ``name``; a clear error lists the registered
    ones, or says the name is an embodied environment."""
    from siirl.environment.embodied.base import EmbodiedEnv

    cls = lookup(name, what)
    if isinstance(cls, type) and issubclass(cls, EmbodiedEnv):
        where = f" (asked for by {what})" if what else ""
        raise ConfigError(f"environment '{name}'{where} is {cls.__module__}.{cls.__name__}, "
                          "an EmbodiedEnv, not a text environment (build it with "
                          "make_embodied_env; embodied runs name it in "
                          "actor_rollout_ref.embodied.env.env_type)")
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)) and not callable(cls):
        raise ConfigError(f"environment '{name}' is registered as {cls!r}, which is not a "
                          "TextEnv class or factory")
    return cls


def make_env(name: str, settings: Optional[Mapping[str, Any]] = None,
             what: Optional[str] = None) -> TextEnv:
    """An instance of text environment ``name`` built with ``settings``; an unknown setting
    is a ConfigError naming it and the settings the environment takes."""
    cls = env_class(name, what)
    return cls(**checked_settings(cls, name, settings, what))


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
