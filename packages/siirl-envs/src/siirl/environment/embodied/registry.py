"""Embodied environments by name, looked up in the one environment registry
(:mod:`siirl.environment.registry`: the built-in simulators, then the ``siirl.environments``
entry-point group that text environments share), so a simulator package registers its
adapter the usual way::

    [project.entry-points."siirl.environments"]
    my_sim = "my_package.sim:MySimEnv"      # an EmbodiedEnv subclass or factory

``make_env`` (text) and ``make_embodied_env`` stay separate because the two APIs differ:
asking one for the other's kind is a clear error, not a confusing failure later.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional

from siirl.environment import registry
from siirl.environment.embodied.base import EmbodiedEnv
from siirl.errors import ConfigError
from siirl.plugins import available

GROUP = registry.GROUP
BUILTIN = registry.BUILTIN


def embodied_env_names() -> List[str]:
    """The built-in names, then every name in the group (text environments included:
    which kind a name is shows only once it is imported)."""
    return registry.environment_names()


def embodied_env_class(name: str, what: Optional[str] = None) -> Any:
    """The class (or factory) registered as ``name``; unknown names and text
    environments are ConfigErrors that say what there is."""
    name = str(name)
    where = f" (asked for by {what})" if what else ""
    if not registry.registered(name):
        others = [n for n in available(GROUP) if n not in BUILTIN]
        raise ConfigError(f"no embodied environment named '{name}'{where}; built in: "
                          f"{', '.join(BUILTIN)}; registered under '{GROUP}': "
                          f"{', '.join(others) or 'none'}")
    cls = registry.lookup(name, what)
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
    env = cls(**registry.checked_settings(cls, name, config, what, "embodied "))
    if not isinstance(env, EmbodiedEnv):
        raise ConfigError(f"environment '{name}' built a {type(env).__name__}, not an "
                          "EmbodiedEnv")
    return env
