"""A toy pipeline whose node raises on worker rank 1 at step 2 (multi-worker failure test)."""

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.protocol import make_batch
from siirl.execution.dag.node import NodeType
from siirl.execution.dag.pipeline import Pipeline


def load(batch, config=None, **kwargs):
    return NodeOutput(batch=make_batch({"x": torch.arange(4.0)}))


def fail_on_rank_one(batch, config=None, **kwargs):
    worker = kwargs["worker"]
    if worker.comm.rank == 1 and worker.global_step == 2:
        raise RuntimeError("boom on rank 1 at step 2")
    return NodeOutput(batch=batch, metrics={"toy/x": batch["x"].mean()})


def rank_one_fails():
    return (Pipeline("rank_one_fails")
            .add_node("load", func=load, node_type=NodeType.DATA_LOAD)
            .add_node("maybe_fail", func="siirl_e2e_failing:fail_on_rank_one", deps=["load"]))
