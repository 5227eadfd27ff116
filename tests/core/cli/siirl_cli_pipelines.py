"""Pipelines of COMPUTE nodes for the CLI tests (importable: pytest puts this dir on sys.path)."""

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.protocol import make_batch
from siirl.execution.dag.node import NodeRole, NodeType
from siirl.execution.dag.pipeline import Pipeline


def load(batch, config=None, **kwargs):
    step = kwargs["worker"].global_step
    return NodeOutput(batch=make_batch({"x": torch.arange(4.0) + step}))


def square(batch, config=None, **kwargs):
    batch["y"] = batch["x"] ** 2
    return NodeOutput(batch=batch, metrics={"toy/y_mean": batch["y"].mean()})


def explode(batch, config=None, **kwargs):
    raise ValueError("boom in user code")


def toy_pipeline():
    return (Pipeline("toy", "load then square")
            .add_node("load", func=load, node_type=NodeType.DATA_LOAD)
            .add_node("square", func="siirl_cli_pipelines:square", deps=["load"],
                      node_type=NodeType.COMPUTE, node_role=NodeRole.DEFAULT))


def failing_pipeline():
    return (Pipeline("failing")
            .add_node("load", func=load, node_type=NodeType.DATA_LOAD)
            .add_node("explode", func="siirl_cli_pipelines:explode", deps=["load"]))


def missing_dep_pipeline():
    return Pipeline("broken").add_node("a", func=square, deps=["ghost"])


def unimportable_pipeline():
    return Pipeline("broken").add_node("a", func="siirl_no_such_module:fn")


def not_a_graph():
    return 42
