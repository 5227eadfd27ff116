"""Helpers the execution tests reference by import path ("siirl_test_pipelines:<name>").

pytest (rootdir mode, no ``__init__.py``) puts this directory on ``sys.path`` before it
imports the test modules here, so ``importlib.import_module("siirl_test_pipelines")`` works.
"""

from siirl.dag_worker.data_structures import NodeOutput
from siirl.execution.dag.pipeline import Pipeline

CONSTANT = {"answer": 42}


def noop(batch, config=None, **kwargs):
    return NodeOutput(batch=batch)


class Steps:
    """A class whose methods are referenced as ``module:Class.method``."""

    def run(self, batch, config=None):
        return NodeOutput(batch=batch)

    @staticmethod
    def static_run(batch, config=None):
        return NodeOutput(batch=batch)


def custom_pipeline():
    """A custom_pipeline_fn returning a Pipeline (load_pipeline must build it)."""
    return (Pipeline("custom_from_fn", "built by siirl_test_pipelines")
            .add_node("first", func="siirl_test_pipelines:noop")
            .add_node("second", func=noop, deps=["first"]))


def custom_graph():
    """A custom_pipeline_fn returning an already built TaskGraph."""
    return Pipeline("custom_graph_fn").add_node("only", func=noop).build()


def not_a_graph():
    return 42
