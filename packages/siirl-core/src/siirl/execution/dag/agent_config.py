"""The configuration of one agent of a multi-agent workflow.

An agent group's engines run with the run's typed configuration (``SiiRLArguments``) with
the ``config:`` blocks of its nodes applied under ``actor_rollout_ref`` (``rollout.n: 1``
sets ``actor_rollout_ref.rollout.n`` for that agent only): a ``dataclasses.replace`` along
the key's path, the other sections shared. The worker builds each agent's engines with it
(``siirl.dag_worker.multi_agent.agent_groups``); the planner asks the actor engine plugin
its on-policy question with it (``siirl.execution.dag.planner``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Dict, Iterable, List

from siirl.errors import PipelineError
from siirl.execution.dag.node import Node


def _replaced(section: Any, path: List[str], value: Any) -> Any:
    """``section`` (a dataclass, or a free-form dict) with the setting at ``path`` set to
    ``value``; ``value`` is checked and converted against its field's type as the parser
    does, and a mapping given for a section merges into it."""
    head, rest = path[0], path[1:]
    if isinstance(section, Mapping):  # a free-form dict: only keys it has
        if head not in section:
            raise KeyError(head)
        return {**section, head: _replaced(section[head], rest, value) if rest else value}
    if not dataclasses.is_dataclass(section) or \
            head not in {f.name for f in dataclasses.fields(section)}:
        raise KeyError(head)
    current = getattr(section, head)
    if rest:
        return dataclasses.replace(section, **{head: _replaced(current, rest, value)})
    if isinstance(value, Mapping) and dataclasses.is_dataclass(current):
        for key, item in value.items():
            current = _replaced(current, [key], item)
        return dataclasses.replace(section, **{head: current})
    from omegaconf import OmegaConf  # the field's type check and conversion

    checked = OmegaConf.structured(section)
    OmegaConf.update(checked, head, value, merge=True)
    return dataclasses.replace(section, **{head: getattr(OmegaConf.to_object(checked), head)})


def group_config(config: Any, nodes: Iterable[Node], group: int) -> Any:
    """The run's configuration (``SiiRLArguments``) with group ``group``'s node settings
    applied."""
    settings: Dict[str, tuple] = {}
    for node in nodes:
        for key, value in (node.config or {}).items():
            seen = settings.get(key)
            if seen is not None and seen[0] != value:
                raise PipelineError(
                    f"agent group {group}: node '{node.node_id}' sets config {key}={value!r} "
                    f"but node '{seen[1]}' sets {key}={seen[0]!r}; one agent's engines have "
                    "one setting")
            settings[key] = (value, node.node_id)
    if not settings:
        return config
    section = config.actor_rollout_ref
    for key, (value, node_id) in settings.items():
        full = f"actor_rollout_ref.{key}"
        try:
            section = _replaced(section, key.split("."), value)
        except Exception as exc:  # unknown key, wrong type: name the node and the key
            raise PipelineError(
                f"node '{node_id}' (agent group {group}): config key '{key}' "
                f"({full}={value!r}) is not a valid setting: {exc}") from exc
    return dataclasses.replace(config, actor_rollout_ref=section)
