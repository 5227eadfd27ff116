"""Engine ownership: a worker's engines by role, built once through the plugin registry.

``build(roles)`` creates them in a fixed order (the actor first) and wires them
explicitly: each factory is handed the engines built before it as ``peers`` (the
reference starts from the actor's initial weights, the ``hf`` rollout generates with the
actor's model; with ``rollout.multi_turn.enable`` the rollout engine is wrapped in the
``multi_turn`` rollout plugin, which gets it as ``peers["rollout"]``). A factory that
cannot work without a peer says so in ``peer_roles`` (``HFRollout.peer_roles =
("actor",)``); that peer is then built even when no node of the
graph uses it, e.g. for a pipeline of a rollout and custom nodes only. The worker then
holds typed engine objects (``engines.actor``, ...), not names looked up at call time.
"""

from __future__ import annotations

import inspect
from operator import attrgetter
from typing import Any, Dict, Iterable, Tuple

from siirl.dag_worker.walk.engine_api import ROLE_PROTOCOLS
from siirl.dag_worker.walk.reward_manager_file import register_file_reward_manager
from siirl.errors import PluginNotFoundError
from siirl.execution.dag.node import NodeRole, NodeType
from siirl.execution.dag.task_graph import TaskGraph
from siirl.params.key_paths import value_at
from siirl.plugins import load_plugin

# role -> (entry-point group, config key naming the plugin, fallback key)
ROLE_SOURCES: Dict[str, Tuple[str, str, str]] = {
    "actor": ("siirl.engines", "actor_rollout_ref.actor.strategy", ""),
    "reference": ("siirl.engines", "actor_rollout_ref.ref.strategy",
                  "actor_rollout_ref.actor.strategy"),
    "critic": ("siirl.engines", "critic.strategy", "actor_rollout_ref.actor.strategy"),
    "rollout": ("siirl.rollouts", "actor_rollout_ref.rollout.name", ""),
    "reward": ("siirl.reward_managers", "reward_model.reward_manager", ""),
    # the reward model (or LLM judge) of reward_model.enable=true: the role "reward_model"
    # of the training backend named by reward_model.strategy
    "reward_model": ("siirl.engines", "reward_model.strategy", ""),
}
BUILD_ORDER = ("actor", "rollout", "reference", "critic", "reward", "reward_model")
# With this key true a worker that builds the reward manager builds the reward model too;
# the reward node scores with both (DAGWorker.compute_reward).
REWARD_MODEL_KEY = "reward_model.enable"
# With this key true the rollout engine of rollout.name is wrapped in the "multi_turn"
# rollout plugin (siirl-envs: the tool-calling loop), handed the engine as peers["rollout"].
MULTI_TURN_KEY = "actor_rollout_ref.rollout.multi_turn.enable"
MULTI_TURN_PLUGIN = "multi_turn"

NODE_ROLE_TO_ENGINE = {
    NodeRole.ROLLOUT: "rollout",
    NodeRole.ACTOR: "actor",
    NodeRole.REFERENCE: "reference",
    NodeRole.CRITIC: "critic",
    NodeRole.REWARD: "reward",
}


# Built-in filters (DAPO's may sit on a ROLLOUT node) run no engine of their own.
_FILTER_NODES = ("siirl.dag_worker.nodes.dapo_filter:", "siirl.dag_worker.nodes.embodied_filter:")


def roles_needed(graph: TaskGraph) -> list:
    """Engine roles the graph's built-in worker methods will ask for."""
    roles = []
    for node in graph.nodes.values():
        # the worker's own node functions, and siirl-envs' nodes that drive its engines
        ref = node.executable_ref or ""
        uses_worker = (ref.startswith(("siirl.dag_worker.", "siirl.environment."))
                       and not ref.startswith(_FILTER_NODES))
        role = NODE_ROLE_TO_ENGINE.get(node.node_role)
        if uses_worker and role and role not in roles and node.node_type is not NodeType.DATA_LOAD:
            roles.append(role)
    return roles


def _accepts(factory: Any, name: str) -> bool:
    """Whether ``factory`` names the keyword ``name`` (a ``**kwargs`` catch-all does not
    count: such factories often forward their keywords to a base that lacks it)."""
    try:
        return name in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


class WorkerEngines:
    """One engine per role: ``actor``, ``rollout``, ``reference``, ``critic``, ``reward``,
    ``reward_model`` (None until built)."""

    def __init__(self, config: Any, worker: Any):
        self.config = config
        self.worker = worker
        self._engines: Dict[str, Any] = {}

    def plugin_name(self, role: str) -> Tuple[str, str, str]:
        group, key, fallback = ROLE_SOURCES[role]
        if role == "reward":  # reward_manager.source=importlib: the user's class, registered
            loaded = register_file_reward_manager(self.config)
            if loaded:
                return group, loaded, "reward_manager.name"
        name = attrgetter(key)(self.config)  # the tables name keys as users type them
        if not name and fallback:
            name, key = attrgetter(fallback)(self.config), fallback
        if not name:
            raise PluginNotFoundError(f"no engine configured for role '{role}': set {key}")
        return group, str(name), key

    def reward_model_enabled(self) -> bool:
        return self.config.reward_model.enable

    def _with_reward_model(self, roles: Iterable[str]) -> list:
        roles = list(roles)
        if "reward" in roles and "reward_model" not in roles and self.reward_model_enabled():
            roles.append("reward_model")
        return roles

    def resolve(self, roles: Iterable[str]) -> None:
        """Import the plugin of every role now, so a missing one fails before any step."""
        for role in self._with_reward_model(roles):
            group, name, key = self.plugin_name(role)
            load_plugin(group, name, what=f"{key}={name}")
            if self._multi_turn(role, name):
                load_plugin(group, MULTI_TURN_PLUGIN, what=f"{MULTI_TURN_KEY}=true")

    def _multi_turn(self, role: str, name: str) -> bool:
        # rollout.multi_turn is siirl-envs' section: absent (off) where it is not installed
        return role == "rollout" and name != MULTI_TURN_PLUGIN and \
            bool(value_at(self.config, MULTI_TURN_KEY, False))

    def peer_roles(self, role: str) -> Tuple[str, ...]:
        """Roles the plugin of ``role`` needs built before it (its factory's ``peer_roles``;
        none for an engine installed with ``set``)."""
        if role in self._engines:
            return ()
        group, name, key = self.plugin_name(role)
        factory = load_plugin(group, name, what=f"{key}={name}")
        return tuple(getattr(factory, "peer_roles", ()))

    def build(self, roles: Iterable[str]) -> None:
        """Build the engines of ``roles``, and the peers their plugins need, in dependency
        order."""
        wanted, todo = set(), self._with_reward_model(roles)
        while todo:
            role = todo.pop()
            if role not in wanted:
                wanted.add(role)
                todo.extend(self.peer_roles(role))
        for role in BUILD_ORDER:
            if role in wanted:
                self.get(role)

    def tokenizer(self) -> Any:
        """The tokenizer of the first built engine that has one (the actor's, when built),
        or None: the dataloader tokenizes with it."""
        for role in BUILD_ORDER:
            found = getattr(self._engines.get(role), "tokenizer", None)
            if found is not None:
                return found
        return None

    def _create(self, role: str) -> Any:
        group, name, key = self.plugin_name(role)
        factory = load_plugin(group, name, what=f"{key}={name}")
        kwargs: Dict[str, Any] = {"role": role, "config": self.config, "worker": self.worker}
        if _accepts(factory, "peers"):
            kwargs["peers"] = dict(self._engines)
        engine = factory(**kwargs)
        if self._multi_turn(role, name):
            wrapper = load_plugin(group, MULTI_TURN_PLUGIN, what=f"{MULTI_TURN_KEY}=true")
            engine = wrapper(role=role, config=self.config, worker=self.worker,
                             peers={**self._engines, "rollout": engine})
        protocol = ROLE_PROTOCOLS[role]
        if not isinstance(engine, protocol):
            raise PluginNotFoundError(
                f"plugin '{name}' ({group}) built a {type(engine).__name__}, which lacks "
                f"the methods of {protocol.__name__} needed for role '{role}'")
        return engine

    def get(self, role: str) -> Any:
        """The engine of ``role``, built on first use (tests, notebooks)."""
        if role not in self._engines:
            self._engines[role] = self._create(role)
        return self._engines[role]

    def set(self, role: str, engine: Any) -> None:
        """Install an engine directly (tests, or one engine serving two roles)."""
        self._engines[role] = engine

    def __contains__(self, role: str) -> bool:
        return role in self._engines


class RoleEngine:
    """``engines.<role>``: the engine of that role, built on first use (``get``)."""

    def __init__(self, role: str):
        self.role = role

    def __get__(self, engines: Any, owner: Any = None) -> Any:
        return self if engines is None else engines.get(self.role)


# one attribute per role of the table, so a role added there is reachable as engines.<role>
for _role in ROLE_SOURCES:
    setattr(WorkerEngines, _role, RoleEngine(_role))
