"""The DAG planner: which TaskGraph each worker runs.

Rule:

* A connected graph (e.g. one linear GRPO/PPO pipeline) is copied to every worker; each
  worker runs it on its own data shard.
* A graph made of independent branches (weakly connected components that share no edge,
  e.g. two agents' sub-pipelines) is split: each component becomes its own sub-TaskGraph
  (``<graph_id>/<first node id>``) run by its own contiguous range of ranks. Components are
  ordered by first appearance in the graph's execution order.
* Workers are shared between components in proportion to a weight: the sum of
  ``model_sizes`` (node id -> size, e.g. billions of parameters) over the component's nodes,
  or 1 for a component none of whose nodes is listed. Every component gets at least one
  worker (a component whose share is below one gets exactly one and the rest are shared
  again among the others); the seats are split with the largest-remainder (Hamilton)
  method, ties going to the earlier component. More components than workers is a
  ConfigError.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Dict, List, Optional

from siirl.errors import ConfigError
from siirl.execution.dag.task_graph import TaskGraph


@dataclass
class WorkerAssignment:
    """One worker's share of the plan.

    ``group`` is the index of the graph component it runs, ``group_ranks`` every rank that
    runs the same sub-graph (empty when an assignment is built by hand) and ``weight`` the
    component's weight.
    """

    rank: int
    graph: TaskGraph
    group: int = 0
    group_ranks: List[int] = field(default_factory=list)
    weight: float = 1.0


def split_components(graph: TaskGraph) -> List[List[str]]:
    """Weakly connected components of a validated graph, as node-id lists.

    Components are ordered by their first node in execution order; within a component
    the node ids keep their execution order.
    """
    parent = {node_id: node_id for node_id in graph.nodes}

    def find(node_id: str) -> str:
        while parent[node_id] != node_id:
            parent[node_id] = parent[parent[node_id]]
            node_id = parent[node_id]
        return node_id

    for node in graph.nodes.values():
        for dep in node.dependencies:
            parent[find(dep)] = find(node.node_id)
    components: Dict[str, List[str]] = {}
    for node_id in graph.get_execution_order():
        components.setdefault(find(node_id), []).append(node_id)
    return list(components.values())


def subgraph(graph: TaskGraph, node_ids: List[str], graph_id: str) -> TaskGraph:
    """A validated TaskGraph holding copies of ``node_ids`` (in the graph's node order)."""
    wanted = set(node_ids)
    sub = TaskGraph(graph_id, graph.description)
    for node in graph.nodes.values():
        if node.node_id in wanted:
            sub.add_node(replace(node, dependencies=list(node.dependencies),
                                    config=dict(node.config),
                                    agent_options=dict(node.agent_options)))
    sub.validate_graph()
    # the planner's decisions about this component's nodes go with it
    sub.planned = graph.planned
    sub.weight_syncs = [step for step in graph.weight_syncs if step.node_id in wanted]
    groups = {node.agent_group for node in sub.nodes.values()}
    sub.left_out = {node_id: left for node_id, left in graph.left_out.items()
                    if (node_id in wanted if node_id in graph.nodes
                        else left.agent_group in groups)}
    return sub


def apportion(weights: List[float], num_workers: int) -> List[int]:
    """Split ``num_workers`` seats over ``weights``: at least one each, largest remainder.

    >>> apportion([7, 1], 8), apportion([1, 1], 5), apportion([100, 1, 1], 4)
    ([7, 1], [3, 2], [2, 1, 1])
    """
    count = len(weights)
    if not weights or any(not w > 0 for w in weights):
        raise ValueError(f"apportion needs positive weights, got {weights}")
    if count > num_workers:
        raise ConfigError(f"the graph has {count} independent components but only "
                          f"{num_workers} worker(s); each component needs at least one "
                          "worker (raise trainer.nnodes * trainer.n_gpus_per_node)")
    exact = [Fraction(w) for w in weights]
    seats = [0] * count
    floor_one: set = set()
    while True:  # components whose share is below one get exactly one; re-share the rest
        free = [i for i in range(count) if i not in floor_one]
        left = num_workers - len(floor_one)
        total = sum(exact[i] for i in free)
        small = {i for i in free if exact[i] * left < total}
        if not small:
            break
        floor_one |= small
    quotas = {i: exact[i] * left / total for i in free}
    for i in range(count):
        seats[i] = 1 if i in floor_one else math.floor(quotas[i])
    spare = num_workers - sum(seats)
    by_remainder = sorted(free, key=lambda i: (-(quotas[i] - seats[i]), i))
    for i in by_remainder[:spare]:
        seats[i] += 1
    return seats


class TaskScheduler:
    """``TaskScheduler(num_workers, model_sizes).schedule(graph)`` -> one assignment per rank."""

    def __init__(self, num_workers: int, model_sizes: Optional[Dict[str, float]] = None):
        if num_workers < 1:
            raise ConfigError(f"the job needs at least one worker, got {num_workers} "
                              "(trainer.nnodes * trainer.n_gpus_per_node)")
        self.num_workers = num_workers
        self.model_sizes = dict(model_sizes or {})
        for name, size in self.model_sizes.items():
            ok = isinstance(size, (int, float)) and not isinstance(size, bool)
            if not ok or not math.isfinite(size) or size <= 0:
                raise ConfigError(f"model_sizes['{name}'] must be a positive number, "
                                  f"got {size!r}")

    def component_weight(self, node_ids: List[str]) -> float:
        sizes = [self.model_sizes[n] for n in node_ids if n in self.model_sizes]
        return float(sum(sizes)) if sizes else 1.0

    def schedule(self, graph: TaskGraph) -> List[WorkerAssignment]:
        graph.validate_graph()
        unknown = [name for name in self.model_sizes if name not in graph.nodes]
        if unknown:
            raise ConfigError(f"model_sizes names {unknown}, which are not nodes of graph "
                              f"'{graph.graph_id}' (nodes: {', '.join(graph.nodes)})")
        components = split_components(graph)
        weights = [self.component_weight(ids) for ids in components]
        if len(components) == 1:
            ranks = list(range(self.num_workers))
            return [WorkerAssignment(rank, graph.copy(), 0, list(ranks), weights[0])
                    for rank in ranks]
        seats = apportion(weights, self.num_workers)
        plan: List[WorkerAssignment] = []
        start = 0
        for group, (node_ids, count) in enumerate(zip(components, seats, strict=True)):
            sub = subgraph(graph, node_ids, f"{graph.graph_id}/{node_ids[0]}")
            ranks = list(range(start, start + count))
            plan.extend(WorkerAssignment(rank, sub.copy(), group, list(ranks), weights[group])
                        for rank in ranks)
            start += count
        return plan


def format_plan(assignments: List[WorkerAssignment]) -> str:
    """Human-readable plan: per group (same component, same graph) its ranks, weight, graph."""
    groups: dict = {}
    for item in assignments:
        key = (item.group, tuple(item.graph.structure()))
        groups.setdefault(key, (item, []))[1].append(item.rank)
    lines = [f"Plan: {len(assignments)} worker(s), {len(groups)} distinct graph(s)"]
    for (group, _), (first, ranks) in groups.items():
        lines.append(f"group {group}: workers {ranks} ({len(ranks)} worker(s), "
                     f"weight {first.weight:g}):")
        lines.extend("  " + line for line in first.graph.format().splitlines())
    return "\n".join(lines)
