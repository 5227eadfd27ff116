"""Engine ownership: a worker's engines by role, created lazily through the plugin registry."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Tuple

from siirl.dag_worker.engine_api import ROLE_PROTOCOLS
from siirl.errors import PluginNotFoundError
from siirl.execution.config_select import select
from siirl.execution.dag.node import NodeRole, NodeType
from siirl.execution.dag.task_graph import TaskGraph
from siirl.plugins import load_plugin

# role -> (entry-point group, config key naming the plugin, fallback key)
ROLE_SOURCES: Dict[str, Tuple[str, str, str]] = {
    "actor": ("siirl.engines", "actor_rollout_ref.actor.strategy", ""),
    "reference": ("siirl.engines", "actor_rollout_ref.ref.strategy",
                  "actor_rollout_ref.actor.strategy"),
    "critic": ("siirl.engines", "critic.strategy", "actor_rollout_ref.actor.strategy"),
    "rollout": ("siirl.rollouts", "actor_rollout_ref.rollout.name", ""),
    "reward": ("siirl.reward_managers", "reward_model.reward_manager", ""),
}

_NODE_ROLE_TO_ENGINE = {
    NodeRole.ROLLOUT: "rollout",
    NodeRole.ACTOR: "actor",
    NodeRole.REFERENCE: "reference",
    NodeRole.CRITIC: "critic",
    NodeRole.REWARD: "reward",
}


def roles_needed(graph: TaskGraph) -> list:
    """Engine roles the graph's built-in worker methods will ask for."""
    roles = []
    for node in graph.nodes.values():
        uses_worker = (node.executable_ref or "").startswith("siirl.dag_worker.dagworker:")
        role = _NODE_ROLE_TO_ENGINE.get(node.node_role)
        if uses_worker and role and role not in roles and node.node_type is not NodeType.DATA_LOAD:
            roles.append(role)
    return roles


class WorkerEngines:
    """Holds one engine per role; ``get(role)`` builds it on first use."""

    def __init__(self, config: Any, worker: Any):
        self.config = config
        self.worker = worker
        self._engines: Dict[str, Any] = {}

    def plugin_name(self, role: str) -> Tuple[str, str, str]:
        group, key, fallback = ROLE_SOURCES[role]
        name = select(self.config, key)
        if not name and fallback:
            name, key = select(self.config, fallback), fallback
        if not name:
            raise PluginNotFoundError(f"no engine configured for role '{role}': set {key}")
        return group, str(name), key

    def resolve(self, roles: Iterable[str]) -> None:
        """Import the plugin of every role now, so a missing one fails before any step."""
        for role in roles:
            group, name, key = self.plugin_name(role)
            load_plugin(group, name, what=f"{key}={name}")

    def get(self, role: str) -> Any:
        if role not in self._engines:
            group, name, key = self.plugin_name(role)
            factory = load_plugin(group, name, what=f"{key}={name}")
            engine = factory(role=role, config=self.config, worker=self.worker)
            protocol = ROLE_PROTOCOLS[role]
            if not isinstance(engine, protocol):
                raise PluginNotFoundError(
                    f"plugin '{name}' ({group}) built a {type(engine).__name__}, which lacks "
                    f"the methods of {protocol.__name__} needed for role '{role}'")
            self._engines[role] = engine
        return self._engines[role]

    def set(self, role: str, engine: Any) -> None:
        """Install an engine directly (tests, or one engine serving two roles)."""
        self._engines[role] = engine

    def __contains__(self, role: str) -> bool:
        return role in self._engines
