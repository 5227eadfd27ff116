"""Agent groups: the agents of a multi-agent workflow (siiRL's MARFT files), each with its
own engines, its own settings, and its own fields in the step's batch.

A node's ``agent_group`` says whose engines it uses. Every group gets the run's typed
configuration with the ``config:`` blocks of its nodes applied under ``actor_rollout_ref``
(``rollout.n: 1`` sets ``actor_rollout_ref.rollout.n`` for that agent only: a
``dataclasses.replace`` along the key's path, the other sections shared:
``siirl.execution.dag.agent_config``, which the planner reads too), and its own
``WorkerEngines``; ``agent_options.share_instance: k`` on a node makes that role's engine
group k's (e.g. one critic for both agents).

In the batch, agent g's fields are stored as ``agent_group_<g>_<field>``; plain fields are
the episode's, shared by all agents (uid, data source, ground truth, env score). A node runs
on its agent's *view*: the shared fields plus its agent's fields under their plain names,
so the ordinary node functions (log-probs, values, updates, rewards) work unchanged; what it
adds or changes goes back under its agent's prefix. Node functions marked
``__siirl_all_agents__`` (the multi-agent rollout, the advantage node) see the whole batch.
A workflow with one agent group is run exactly as before: no views, no prefixes.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional

from siirl.errors import PipelineError
from siirl.execution.dag.agent_config import group_config
from siirl.execution.dag.node import Node
from siirl.execution.dag.task_graph import TaskGraph

_AGENT_KEY = re.compile(r"^agent_group_(\d+)_(.+)$")
ALL_AGENTS = "__siirl_all_agents__"


def prefix(group: int) -> str:
    return f"agent_group_{group}_"


def agent_field(key: str) -> Optional[tuple]:
    """``(group, field)`` for an agent's key, None for a shared one."""
    match = _AGENT_KEY.match(key)
    return (int(match.group(1)), match.group(2)) if match else None


def group_ids(graph: TaskGraph) -> List[int]:
    return sorted({node.agent_group for node in graph.nodes.values()})


class AgentGroups:
    """Per-agent configuration and engines of one worker (one group for ordinary graphs)."""

    def __init__(self, graph: TaskGraph, config: Any, worker: Any):
        from siirl.dag_worker.walk.engines import WorkerEngines

        self.graph = graph
        self.ids = group_ids(graph) or [0]
        self.multi = len(self.ids) > 1
        by_group = {g: [n for n in graph.nodes.values() if n.agent_group == g] for g in self.ids}
        self.configs = {g: group_config(config, by_group[g], g) if self.multi else config
                        for g in self.ids}
        self.engines = {g: WorkerEngines(self.configs[g], worker=worker) for g in self.ids}
        self._nodes = by_group
        # (group, role) -> group whose engine it uses
        self.shared: Dict[tuple, int] = {}
        for node in graph.nodes.values():
            source = node.agent_options.get("share_instance")
            if source is None:
                continue
            if source not in self.ids:
                raise PipelineError(f"node '{node.node_id}': agent_options.share_instance="
                                    f"{source} names no agent group of the workflow "
                                    f"(groups: {self.ids})")
            role = _engine_role(node)
            if role is not None:
                self.shared[(node.agent_group, role)] = source

    def roles(self, group: int) -> List[str]:
        """Engine roles group ``group``'s nodes ask for (shared ones included)."""
        from siirl.dag_worker.walk.engines import roles_needed

        sub = TaskGraph(f"agent_group_{group}")
        for node in self._nodes[group]:
            sub.nodes[node.node_id] = node
        return roles_needed(sub)

    def all_roles(self) -> List[str]:
        return sorted({role for g in self.ids for role in self.roles(g)})

    def resolve(self) -> None:
        for g in self.ids:
            self.engines[g].resolve(self.roles(g))

    def build(self) -> None:
        """Each group's own engines, then the shared ones handed over."""
        for g in self.ids:
            own = [r for r in self.roles(g) if (g, r) not in self.shared]
            self.engines[g].build(own)
        for (g, role), source in self.shared.items():
            self.engines[g].set(role, self.engines[source].get(role))

    def stateful(self, roles: Iterable[str]) -> Dict[str, Any]:
        """Checkpointed engines by folder name: group 0's as ``actor``, ``critic``;
        another group's as ``agent_group_<g>_actor``; a shared engine once."""
        found: Dict[str, Any] = {}
        seen = set()
        for g in self.ids:
            engines = self.engines[g]
            for role in roles:
                if role in engines and id(engines.get(role)) not in seen:
                    seen.add(id(engines.get(role)))
                    found[role if g == self.ids[0] else prefix(g) + role] = engines.get(role)
        return found

    # ---- the batch seen by one agent's node -------------------------------------------

    @staticmethod
    def view(batch: Any, group: int) -> Any:
        """Shared fields plus ``group``'s fields under their plain names."""
        from tensordict import TensorDict

        view = TensorDict({}, batch_size=batch.batch_size)
        mine = {}
        for key in batch.keys():
            owner = agent_field(key)
            if owner is None:
                view.set(key, batch.get(key))
            elif owner[0] == group:
                mine[owner[1]] = batch.get(key)
        for key, value in mine.items():
            view.set(key, value)
        return view

    @staticmethod
    def snapshot(view: Any) -> Dict[str, int]:
        """The view's shared fields before a node runs (key -> object id)."""
        return {key: id(view.get(key)) for key in view.keys() if agent_field(key) is None}

    @staticmethod
    def merge(batch: Any, before: Dict[str, int], out: Any, group: int) -> Any:
        """``batch`` with what the node added or changed (its output ``out``, compared with
        the view's ``snapshot`` taken before it ran) stored under ``group``'s prefix."""
        if out is None:
            return batch
        merged = batch.clone(recurse=False)
        for key in out.keys():
            value = out.get(key)
            if before.get(key) == id(value):
                continue  # a shared field the node left alone
            merged.set(prefix(group) + key, value)
        return merged

    def metric_names(self, group: int, metrics: Dict[str, Any]) -> Dict[str, Any]:
        return {f"agent_group_{group}/{name}": value for name, value in (metrics or {}).items()}

    def skips_training(self, node: Node, step: int) -> bool:
        """``agent_options.train_cycle: c``: the agents train in turns of c steps (steps
        1..c the first agent group, c+1..2c the next, ...); other steps skip the node."""
        cycle = node.agent_options.get("train_cycle")
        if not cycle or not self.multi:
            return False
        turn = (max(int(step), 1) - 1) // int(cycle) % len(self.ids)
        return self.ids[turn] != node.agent_group

    def planned_out(self, node: Node, step: int) -> bool:
        """Whether the planner left ``node`` out of step ``step``: a node it planned for
        some steps only runs in steps 1..``until_step`` and in those where the update
        ``while_waiting`` waits for its train_cycle turn."""
        windows = []
        if node.until_step is not None:
            windows.append(step <= node.until_step)
        if node.while_waiting is not None:
            windows.append(self.skips_training(self.graph.nodes[node.while_waiting], step))
        return bool(windows) and not any(windows)


def _engine_role(node: Node) -> Optional[str]:
    from siirl.dag_worker.walk.engines import NODE_ROLE_TO_ENGINE

    return NODE_ROLE_TO_ENGINE.get(node.node_role)


def sees_all_agents(func: Any) -> bool:
    target = getattr(func, "__func__", func)
    return bool(getattr(target, ALL_AGENTS, False))
