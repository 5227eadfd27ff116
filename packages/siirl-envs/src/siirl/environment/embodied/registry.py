"""Embodied environments by name.

The built-in ones are listed here (found even where the distribution's entry points are
stale, as in a source checkout); any other name is looked up in the ``siirl.environments``
entry-point group that text environments share, so a simulator package registers its
adapter the usual way::

    [project.entry-points."siirl.environments"]
    my_sim = "my_package.sim:MySimEnv"      # an EmbodiedEnv subclass or factory

``make_env`` (text) and ``make_embodied_env`` stay separate because the two APIs differ:
asking one for the other's kind is a clear error, not a confusing failure later.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, List, Mapping, Optional

from siirl.environment.embodied.base import EmbodiedEnv
from siirl.errors import ConfigError
from siirl.plugins import available, load_plugin

GROUP = "siirl.environments"
BUILTIN = {"reach": "siirl.environment.embodied.tasks.reach2d:Reach2D",
           # imported only when asked for: they need their extras (and a renderer)
           "robosuite": "siirl.environment.embodied.adapters.robosuite:RobosuiteEnv",
           "libero": "siirl.environment.embodied.adapters.libero:LiberoEnv"}


def embodied_env_names() -> List[str]:
    """The built-in names, then every name in the group (text environments included:
    which kind a name is shows only once it is imported)."""
    return list(BUILTIN) + [n for n in available(GROUP) if n not in BUILTIN]


def embodied_env_class(name: str, what: Optional[str] = None) -> Any:
    """The class (or factory) registered as ``name``; unknown names and text
    environments are ConfigErrors that say what there is."""
    name = str(name)
    where = f" (asked for by {what})" if what else ""
    if name in BUILTIN:
        module, _, attr = BUILTIN[name].partition(":")
        cls = getattr(importlib.import_module(module), attr)
    elif name in available(GROUP):
        cls = load_plugin(GROUP, name, what)
    else:
        others = [n for n in available(GROUP) if n not in BUILTIN]
        raise ConfigError(f"no embodied environment named '{name}'{where}; built in: "
                          f"{', '.join(BUILTIN)}; registered under '{GROUP}': "
                          f"{', '.join(others) or 'none'}")
    if isinstance(cls, type) and not issubclass(cls, EmbodiedEnv):
        raise ConfigError(f"environment '{name}'{where} is {cls.__module__}.{cls.__name__}, "
                          "not an EmbodiedEnv (a text environment? build it with make_env)")
    if not callable(cls):
        raise ConfigError(f"environment '{name}'{where} is registered as {cls!r}, which is "
                          "not an EmbodiedEnv class or factory")
    return cls


def make_embodied_env(name: str, config: Optional[Mapping[str, Any]] = None,
                      what: Optional[str] = None) -> EmbodiedEnv:
    """An instance of embodied environment ``name`` built with ``config`` (its keyword
    arguments); an unknown key is a ConfigError naming the keys it takes."""
    cls = embodied_env_class(name, what)
    config = dict(config or {})
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        signature = None
    if signature is not None and not any(p.kind == p.VAR_KEYWORD
                                         for p in signature.parameters.values()):
        accepted = [p for p in signature.parameters if p != "self"]
        unknown = sorted(set(config) - set(accepted))
        if unknown:
            prefix = f"{what}: " if what else ""
            raise ConfigError(f"{prefix}embodied environment '{name}' has no setting "
                              f"{', '.join(map(repr, unknown))}; it takes: "
                              f"{', '.join(accepted) or 'none'}")
    env = cls(**config)
    if not isinstance(env, EmbodiedEnv):
        raise ConfigError(f"environment '{name}' built a {type(env).__name__}, not an "
                          "EmbodiedEnv")
    return env
