"""TaskGraph: the validated DAG a DAGWorker executes."""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Any, Dict, List, Optional

from siirl.errors import PipelineError
from siirl.execution.dag.node import Node


class TaskGraph:
    """Nodes keyed by id plus forward (``adj``) and reverse (``rev_adj``) edges."""

    def __init__(self, graph_id: str, description: str = ""):
        self.graph_id = graph_id
        self.description = description
        self.nodes: Dict[str, Node] = {}
        self.adj: Dict[str, List[str]] = {}
        self.rev_adj: Dict[str, List[str]] = {}
        # Set by the planner (``planner.plan_graph``): node id -> why it is left out
        # (``planner.LeftOut``), and the weight-sync steps it inserts (``WeightSyncStep``).
        self.planned = False
        self.left_out: Dict[str, Any] = {}
        self.weight_syncs: List[Any] = []

    def add_node(self, node: Node) -> TaskGraph:
        if node.node_id in self.nodes:
            raise PipelineError(f"graph '{self.graph_id}': duplicate node id '{node.node_id}'")
        self.nodes[node.node_id] = node
        return self

    def add_nodes(self, nodes: List[Node]) -> TaskGraph:
        for node in nodes:
            self.add_node(node)
        return self

    def get_node(self, node_id: str) -> Optional[Node]:
        return self.nodes.get(node_id)

    def build_adjacency_lists(self) -> None:
        """Derive ``adj``/``rev_adj`` from each node's dependencies (kept in order)."""
        self.adj = {node_id: [] for node_id in self.nodes}
        self.rev_adj = {node_id: [] for node_id in self.nodes}
        for node in self.nodes.values():
            for dep in node.dependencies:
                if dep not in self.nodes:
                    continue  # reported by validate_graph
                self.adj[dep].append(node.node_id)
                self.rev_adj[node.node_id].append(dep)

    def validate_graph(self) -> None:
        """Raise PipelineError on a missing dependency, a bad type/role, or a cycle."""
        if not self.nodes:
            raise PipelineError(f"graph '{self.graph_id}' has no nodes")
        for node in self.nodes.values():
            node.check_type_role()
            if len(set(node.dependencies)) != len(node.dependencies):
                raise PipelineError(f"node '{node.node_id}' lists a dependency twice: "
                                    f"{node.dependencies}")
            for dep in node.dependencies:
                if dep == node.node_id:
                    raise PipelineError(f"node '{node.node_id}' depends on itself")
                if dep not in self.nodes:
                    known = ", ".join(self.nodes)
                    raise PipelineError(f"node '{node.node_id}' depends on '{dep}', which is "
                                        f"not in graph '{self.graph_id}' (nodes: {known})")
        self.build_adjacency_lists()
        self.get_execution_order()  # raises on a cycle

    def get_execution_order(self) -> List[str]:
        """Topological order (Kahn); among ready nodes the one added first runs first, so
        runs are reproducible."""
        if len(self.adj) != len(self.nodes):
            self.build_adjacency_lists()
        position = {node_id: i for i, node_id in enumerate(self.nodes)}
        indegree = {node_id: len(self.rev_adj[node_id]) for node_id in self.nodes}
        ready = [position[n] for n in self.nodes if indegree[n] == 0]
        heapq.heapify(ready)
        names = list(self.nodes)
        order: List[str] = []
        while ready:
            node_id = names[heapq.heappop(ready)]
            order.append(node_id)
            for child in self.adj[node_id]:
                indegree[child] -= 1
                if indegree[child] == 0:
                    heapq.heappush(ready, position[child])
        if len(order) != len(self.nodes):
            raise PipelineError(f"graph '{self.graph_id}' has a cycle through nodes: "
                                f"{', '.join(self._cycle())}")
        return order

    def _cycle(self) -> List[str]:
        """One concrete cycle, as a path that returns to its first node."""
        state: Dict[str, int] = {}  # 1 = on the DFS stack, 2 = finished
        stack: List[str] = []

        def visit(node_id: str) -> Optional[List[str]]:
            state[node_id] = 1
            stack.append(node_id)
            for child in self.adj[node_id]:
                if state.get(child) == 1:
                    return stack[stack.index(child):] + [child]
                if child not in state:
                    found = visit(child)
                    if found:
                        return found
            stack.pop()
            state[node_id] = 2
            return None

        for node_id in self.nodes:
            if node_id not in state:
                found = visit(node_id)
                if found:
                    return found
        return []

    def get_entry_nodes(self) -> List[str]:
        return [n for n in self.get_execution_order() if not self.nodes[n].dependencies]

    def get_exit_nodes(self) -> List[str]:
        return [n for n in self.get_execution_order() if not self.adj[n]]

    def copy(self, graph_id: Optional[str] = None) -> TaskGraph:
        clone = TaskGraph(graph_id or self.graph_id, self.description)
        for node in self.nodes.values():
            clone.add_node(replace(node, dependencies=list(node.dependencies),
                                    config=dict(node.config),
                                    agent_options=dict(node.agent_options)))
        clone.build_adjacency_lists()
        clone.planned, clone.left_out = self.planned, dict(self.left_out)
        clone.weight_syncs = list(self.weight_syncs)
        return clone

    def structure(self) -> List[tuple]:
        """A comparable summary: (id, type, role, deps, func ref) per node, in order."""
        ordered = (self.nodes[node_id] for node_id in self.get_execution_order())
        return [(n.node_id, n.node_type, n.node_role, tuple(n.dependencies), n.executable_ref,
                 n.only_forward_compute) for n in ordered]

    def __eq__(self, other) -> bool:
        return isinstance(other, TaskGraph) and self.structure() == other.structure()

    __hash__ = None

    def __repr__(self) -> str:
        return f"TaskGraph({self.graph_id!r}, nodes={list(self.nodes)})"

    def format(self) -> str:
        lines = [f"TaskGraph '{self.graph_id}'" + (f": {self.description}" if self.description
                                                   else "")]
        syncs: Dict[tuple, List[Any]] = {}
        for step in self.weight_syncs:
            syncs.setdefault((step.where, step.node_id), []).append(step)
        for node_id in self.get_execution_order():
            lines.extend("  " + s.describe() for s in syncs.get(("before", node_id), []))
            lines.append("  " + self.nodes[node_id].describe())
            lines.extend("  " + s.describe() for s in syncs.get(("after", node_id), []))
        lines.extend(f"  left out: {node_id}: {left.reason}"
                     for node_id, left in self.left_out.items())
        return "\n".join(lines)
