"""Plugin registry over Python entry points.

siirl-core never imports ``siirl.engine`` or ``siirl.environment``: it asks this registry
for a name in a group, and the distribution that registered the name is imported only
then (so choosing ``fsdp`` never imports megatron). Third-party packages register the
same way, in their ``pyproject.toml``::

    [project.entry-points."siirl.engines"]
    my_engine = "my_package.engine:MyEngineFactory"

``register(group, name)`` adds an in-process entry (tests, notebooks); it is looked up
before entry points.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable, Dict, List, Optional

from siirl.errors import PluginNotFoundError

GROUPS: Dict[str, str] = {
    "siirl.engines": "actor / critic / reference training backends",
    "siirl.rollouts": "rollout (generation) engines",
    "siirl.reward_managers": "reward managers",
    "siirl.environments": "agentic and embodied environments",
    "siirl.pipelines": "named workflows returning a TaskGraph",
    "siirl.config": "config sections of backends, rollouts and environments",
}

# The names siiRL's own distributions register, with the pip line that provides each
# (tests check this against their pyproject.toml files); only these get a pip hint.
PROVIDED: Dict[str, Dict[str, str]] = {
    "siirl.engines": {"fsdp": "siirl-engine", "megatron": "siirl-engine[megatron]"},
    "siirl.rollouts": {"hf": "siirl-engine", "vllm": "siirl-engine[vllm]",
                       "sglang": "siirl-engine[sglang]", "multi_turn": "siirl-envs"},
    "siirl.reward_managers": {name: "siirl-engine" for name in
                              ("naive", "batch", "parallel", "dapo", "embodied")},
    "siirl.environments": {"sokoban": "siirl-envs", "tool_math": "siirl-envs",
                           "frozen_lake": "siirl-envs[gym]", "gem": "siirl-envs[gem]",
                           "textarena": "siirl-envs[textarena]"},
    "siirl.pipelines": {**{name: "siirl-core" for name in ("grpo", "ppo", "dapo", "remax")},
                        "agentic": "siirl-envs", "agentic_ppo": "siirl-envs",
                        "embodied": "siirl-envs"},
    "siirl.config": {"fsdp": "siirl-engine", "megatron": "siirl-engine",
                     "reward_model": "siirl-engine", "reward_judge": "siirl-engine",
                     "rollout": "siirl-engine", "env_manager": "siirl-envs",
                     "env_scheduler": "siirl-envs", "embodied": "siirl-envs",
                     "multi_turn": "siirl-envs", "custom_envs": "siirl-envs"},
}
# The distribution whose entry points fill each group (a broken entry point is reinstalled)
_GROUP_PROVIDER = {
    "siirl.engines": "siirl-engine",
    "siirl.rollouts": "siirl-engine",
    "siirl.reward_managers": "siirl-engine",
    "siirl.environments": "siirl-envs",
    "siirl.pipelines": "siirl-core",
    "siirl.config": "siirl-engine",
}

_LOCAL: Dict[str, Dict[str, Any]] = {group: {} for group in GROUPS}


def _check_group(group: str) -> None:
    if group not in GROUPS:
        raise PluginNotFoundError(f"unknown plugin group '{group}' "
                                  f"(groups: {', '.join(GROUPS)})")


def install_hint(group: str, name: str) -> str:
    """The ``pip install`` that provides ``name``, or where a plugin would register it."""
    package = PROVIDED.get(group, {}).get(name)
    if package is None:
        return (f"no siiRL distribution provides it; a plugin package registers it under "
                f"[project.entry-points.\"{group}\"] in its pyproject.toml")
    return f"pip install \"{package}\""


def _reinstall_hint(group: str, name: str, dist: Optional[str]) -> str:
    package = PROVIDED.get(group, {}).get(name) or dist or _GROUP_PROVIDER.get(group)
    return f"pip install \"{package}\""


def _entry_points(group: str) -> Dict[str, EntryPoint]:
    found: Dict[str, EntryPoint] = {}
    for ep in entry_points(group=group):
        previous = found.get(ep.name)
        if previous is not None and previous.value != ep.value:
            raise PluginNotFoundError(
                f"plugin '{ep.name}' in group '{group}' is registered twice: "
                f"'{previous.value}' and '{ep.value}'; uninstall one of the packages")
        found[ep.name] = ep
    return found


def available(group: str) -> List[str]:
    """Names installed in ``group`` (entry points plus in-process registrations)."""
    _check_group(group)
    return sorted(set(_entry_points(group)) | set(_LOCAL[group]))


def register(group: str, name: str) -> Callable[[Any], Any]:
    """Decorator registering ``obj`` under ``group``/``name`` for this process only."""
    _check_group(group)

    def decorate(obj: Any) -> Any:
        current = _LOCAL[group].get(name)
        if current is not None and current is not obj:
            raise PluginNotFoundError(f"plugin '{name}' is already registered in '{group}'")
        _LOCAL[group][name] = obj
        return obj

    return decorate


def unregister(group: str, name: str) -> None:
    _check_group(group)
    _LOCAL[group].pop(name, None)


def load_plugin(group: str, name: str, what: Optional[str] = None) -> Any:
    """Return the object registered as ``name`` in ``group``, importing it now.

    ``what`` names the config key that asked for it, so the error points at the line
    the user wrote.
    """
    _check_group(group)
    if name in _LOCAL[group]:
        return _LOCAL[group][name]
    eps = _entry_points(group)
    asked = f" (asked for by {what})" if what else ""
    if name not in eps:
        installed = ", ".join(sorted(set(eps) | set(_LOCAL[group]))) or "none"
        raise PluginNotFoundError(
            f"no plugin named '{name}' in group '{group}'{asked}; installed: {installed}. "
            f"To get it: {install_hint(group, name)}")
    ep = eps[name]
    try:
        return ep.load()
    except (ImportError, AttributeError) as exc:
        dist = ep.dist.name if ep.dist is not None else None
        raise PluginNotFoundError(
            f"plugin '{name}' in group '{group}'{asked} is registered by "
            f"{dist or 'its package'} but cannot be imported ({type(exc).__name__}: {exc}). "
            f"To fix: {_reinstall_hint(group, name, dist)}") from exc
