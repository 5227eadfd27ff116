"""The DAG planner: which TaskGraph each worker runs.

Today every worker runs the whole (linear) graph on its own data shard; splitting
independent branches over groups of workers comes with multi-worker execution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from siirl.errors import ConfigError
from siirl.execution.dag.task_graph import TaskGraph


@dataclass
class WorkerAssignment:
    rank: int
    graph: TaskGraph


class TaskScheduler:
    def __init__(self, num_workers: int):
        if num_workers < 1:
            raise ConfigError(f"the job needs at least one worker, got {num_workers} "
                              "(trainer.nnodes * trainer.n_gpus_per_node)")
        self.num_workers = num_workers

    def schedule(self, graph: TaskGraph) -> List[WorkerAssignment]:
        graph.validate_graph()
        return [WorkerAssignment(rank, graph.copy()) for rank in range(self.num_workers)]


def format_plan(assignments: List[WorkerAssignment]) -> str:
    """Human-readable plan: workers grouped by the graph they run."""
    by_graph: dict = {}
    for item in assignments:
        key = tuple(item.graph.structure())
        by_graph.setdefault(key, (item.graph, []))[1].append(item.rank)
    lines = [f"Plan: {len(assignments)} worker(s), {len(by_graph)} distinct graph(s)"]
    for graph, ranks in by_graph.values():
        lines.append(f"workers {ranks}:")
        lines.extend("  " + line for line in graph.format().splitlines())
    return "\n".join(lines)
