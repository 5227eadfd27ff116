"""Asynchronous training as a placement of the planned graph (``async_training.enable``).

The graph is cut in two: the **rollout sub-graph** (the rollout node and the nodes after it
that need no trained weights: reward scoring) runs on the rollout workers
(``rollout.nnodes * rollout.n_gpus_per_node``), the **training sub-graph** (advantage,
log-probs, updates) on the trainer workers (``trainer.nnodes * trainer.n_gpus_per_node``).
Between them the rollout workers stream scored prompt groups to the trainers, and the
trainers send their weights back every ``async_training.trigger_parameter_sync_step``
steps. Trainers take ranks ``0..T-1`` (rank 0 logs and commits checkpoints), rollout
workers the ranks after them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from siirl.errors import ConfigError, PipelineError
from siirl.execution.dag.node import NodeRole, NodeType
from siirl.execution.dag.task_graph import TaskGraph
from siirl.execution.scheduler.task_scheduler import WorkerAssignment, subgraph

# roles that read no trained weights: they can run beside a policy of an older version
ROLLOUT_SIDE_ROLES = (NodeRole.ROLLOUT, NodeRole.REWARD)


def is_async(config: Any) -> bool:
    return bool(config.async_training.enable)


def worker_counts(config: Any) -> tuple:
    """(trainer workers, rollout workers) of an asynchronous run."""
    trainer, rollout = config.trainer, config.rollout
    return trainer.nnodes * trainer.n_gpus_per_node, rollout.nnodes * rollout.n_gpus_per_node


@dataclass
class AsyncSplit:
    trainer: TaskGraph
    rollout: TaskGraph
    stream_from: str  # the rollout sub-graph's exit node: its rows are streamed
    stream_to: List[str] = field(default_factory=list)  # training nodes that read them

    def describe(self, trainers: List[int], rollouts: List[int]) -> List[str]:
        return [f"stream: {self.stream_from} (workers {rollouts}) -> "
                f"{', '.join(self.stream_to)} (workers {trainers}): scored prompt groups, "
                "each once all its rollout.n samples are scored, with the policy version "
                "that generated them",
                f"weight_sync (actor -> rollout) from worker {trainers[0]} to workers "
                f"{rollouts}: every async_training.trigger_parameter_sync_step trainer "
                "steps, in rollout.update_weights_bucket_megabytes buckets"]


def _rollout_side(graph: TaskGraph) -> List[str]:
    side: List[str] = []
    for node_id in graph.get_execution_order():
        node = graph.nodes[node_id]
        if node.node_type is NodeType.MODEL_TRAIN:
            continue
        if node.node_role in ROLLOUT_SIDE_ROLES and all(d in side for d in node.dependencies):
            if node.node_role is NodeRole.ROLLOUT or node.dependencies:
                side.append(node_id)
    return side


def split_graph(graph: TaskGraph) -> AsyncSplit:
    """The planned ``graph`` cut into its rollout and training sub-graphs."""
    side = _rollout_side(graph)
    if not any(graph.nodes[n].node_role is NodeRole.ROLLOUT for n in side):
        raise PipelineError(f"async_training.enable=true needs a rollout node at the start of "
                            f"graph '{graph.graph_id}': it has none to run on the rollout "
                            "workers")
    graph.build_adjacency_lists()
    exits = [n for n in side if not any(child in side for child in graph.adj[n])]
    if len(exits) != 1:
        raise PipelineError(f"async_training.enable=true streams the rows of one node from "
                            f"the rollout workers, but graph '{graph.graph_id}' ends its "
                            f"rollout part in {exits}: join them in one node")
    rest = [n for n in graph.get_execution_order() if n not in side]
    if not rest:
        raise PipelineError(f"graph '{graph.graph_id}' has nothing to train: "
                            "async_training.enable=true needs a training sub-graph")
    readers = [n for n in rest if any(d in side for d in graph.nodes[n].dependencies)]
    wrong = [n for n in readers if any(d in side and d != exits[0]
                                       for d in graph.nodes[n].dependencies)]
    if wrong:
        raise PipelineError(f"node(s) {wrong} of graph '{graph.graph_id}' read rollout nodes "
                            f"other than {exits[0]}, whose rows are the only ones streamed "
                            "to the trainers (async_training.enable=true)")
    rollout = subgraph(graph, side, f"{graph.graph_id}/rollout")
    trainer = graph.copy(f"{graph.graph_id}/trainer")
    for node_id in side:
        trainer.nodes.pop(node_id)
    for node in trainer.nodes.values():  # streamed rows are the entry nodes' input
        node.dependencies = [d for d in node.dependencies if d not in side]
    trainer.validate_graph()
    # the weights travel by the stream's side channel, not the in-process sync steps
    graph.weight_syncs, trainer.weight_syncs, rollout.weight_syncs = [], [], []
    trainer.left_out, rollout.left_out = dict(graph.left_out), {}
    return AsyncSplit(trainer, rollout, exits[0], readers)


def assignments(graph: TaskGraph, config: Any) -> tuple:
    """(one ``WorkerAssignment`` per rank, the lines that describe the stream)."""
    trainers, rollouts = worker_counts(config)
    if trainers < 1 or rollouts < 1:
        raise ConfigError("async_training.enable=true needs at least one trainer worker "
                          "(trainer.nnodes * trainer.n_gpus_per_node) and one rollout worker "
                          "(rollout.nnodes * rollout.n_gpus_per_node)")
    split = split_graph(graph)
    trainer_ranks = list(range(trainers))
    rollout_ranks = list(range(trainers, trainers + rollouts))
    plan = [WorkerAssignment(rank, split.trainer.copy(), 0, list(trainer_ranks))
            for rank in trainer_ranks]
    plan += [WorkerAssignment(rank, split.rollout.copy(), 1, list(rollout_ranks))
             for rank in rollout_ranks]
    return plan, split.describe(trainer_ranks, rollout_ranks)
