"""The spec's documented code blocks (Pipeline API: Basic Usage, Custom Pipeline Definition,
Custom Node Function; Code Structure: Extension Points), run exactly as written.

Each block is kept verbatim in a string and executed. Where a block names placeholder
modules ("module:function", "my_module:my_function"), the test provides those modules; the
blocks themselves are unchanged.
"""

import subprocess
import sys
import textwrap

import pytest
import torch

from siirl.dag_worker.dagworker import DAGWorker
from siirl.data_coordinator.protocol import make_batch
from siirl.errors import PipelineError
from siirl.execution.dag.task_graph import TaskGraph
from siirl.plugins import register, unregister

BASIC_USAGE = '''
from siirl.execution.dag.pipeline import Pipeline
from siirl.execution.dag.node import NodeType, NodeRole

pipeline = Pipeline("my_pipeline", "Description")

# Add nodes (supports chaining)
pipeline.add_node(
    "node_id",
    func="module:function",  # or "module:Class.method"
    deps=["dependency_node_ids"],
    node_type=NodeType.COMPUTE,
    node_role=NodeRole.DEFAULT
).add_node(
    "next_node",
    func="module:another_function",
    deps=["node_id"],
    node_type=NodeType.MODEL_TRAIN,
    node_role=NodeRole.ACTOR
)

# Build TaskGraph
task_graph = pipeline.build()
'''

CUSTOM_PIPELINE = '''
from siirl.execution.dag.pipeline import Pipeline
from siirl.execution.dag.task_graph import TaskGraph
from siirl.execution.dag.node import NodeType, NodeRole

def my_custom_pipeline() -> TaskGraph:
    pipeline = Pipeline("my_pipeline", "My workflow")

    pipeline.add_node(
        "rollout_actor",
        func="siirl.dag_worker.dagworker:DAGWorker.generate",
        deps=[],
        node_type=NodeType.MODEL_INFERENCE,
        node_role=NodeRole.ROLLOUT
    ).add_node(
        "my_custom_node",
        func="my_module:my_function",
        deps=["rollout_actor"],
        node_type=NodeType.COMPUTE,
        node_role=NodeRole.DEFAULT
    )

    return pipeline.build()
'''

CUSTOM_NODE_FUNCTION = '''
from siirl.dag_worker.data_structures import NodeOutput

def my_function(batch, config=None, **kwargs) -> NodeOutput:
    """
    Args:
        batch: Input data (TensorDict)
        config: Global configuration
        **kwargs: Additional arguments

    Returns:
        NodeOutput(batch=processed_batch, metrics={})
    """
    # Process batch
    processed_batch = process(batch)

    # Collect metrics
    metrics = {"metric_name": value}

    return NodeOutput(batch=processed_batch, metrics=metrics)
'''

EXTENSION_NODE = '''
def my_node(batch, config=None, **kwargs) -> NodeOutput:
    return NodeOutput(batch=batch, metrics={})
'''

# What the blocks leave to the reader: `process` and `value` in the node function's module.
NODE_MODULE_PRELUDE = '''
def process(batch):
    batch["doubled"] = batch["responses"] * 2
    return batch

value = 1.5
'''


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """Write the modules the blocks reference onto sys.path, as a user would."""
    (tmp_path / "module.py").write_text(
        "def function(batch, config=None, **kwargs):\n    return None\n\n"
        "def another_function(batch, config=None, **kwargs):\n    return None\n")
    (tmp_path / "my_module.py").write_text(
        NODE_MODULE_PRELUDE + CUSTOM_NODE_FUNCTION + EXTENSION_NODE
        + textwrap.dedent(CUSTOM_PIPELINE))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("module", "my_module"):
        sys.modules.pop(name, None)
    yield tmp_path
    for name in ("module", "my_module"):
        sys.modules.pop(name, None)


def test_basic_usage_reports_its_placeholder_dependency(user_modules):
    # The block, as written, depends on a node named "dependency_node_ids" that it never
    # adds: build() must reject it with an error naming that dependency.
    with pytest.raises(PipelineError, match="dependency_node_ids"):
        exec(BASIC_USAGE, {})


def test_basic_usage_builds_once_its_dependency_exists(user_modules):
    from siirl.execution.dag.node import NodeRole, NodeType
    from siirl.execution.dag.pipeline import Pipeline

    namespace = {}
    exec(BASIC_USAGE.replace("task_graph = pipeline.build()", ""), namespace)
    pipeline = namespace["pipeline"]
    assert isinstance(pipeline, Pipeline)
    pipeline.add_node("dependency_node_ids", func="module:function",
                      node_type=NodeType.COMPUTE, node_role=NodeRole.DEFAULT)
    graph = pipeline.build()
    assert graph.get_execution_order() == ["dependency_node_ids", "node_id", "next_node"]


class _FakeRollout:
    def __init__(self, role, config, worker):
        self.worker = worker

    def generate(self, batch, validate=False):
        from siirl.dag_worker.data_structures import NodeOutput
        batch["responses"] = batch["input_ids"] + 100
        return NodeOutput(batch=batch, metrics={"rollout/calls": 1})


def test_custom_pipeline_and_node_function_run(user_modules):
    namespace = {}
    exec(CUSTOM_PIPELINE, namespace)
    graph = namespace["my_custom_pipeline"]()
    assert isinstance(graph, TaskGraph)
    assert graph.get_execution_order() == ["rollout_actor", "my_custom_node"]

    register("siirl.rollouts", "spec_fake")(_FakeRollout)
    try:
        config = {"actor_rollout_ref": {"rollout": {"name": "spec_fake"}}}
        worker = DAGWorker(graph, config)
        batch = make_batch({"input_ids": torch.arange(6).view(3, 2)})
        result = worker.execute_task_graph(batch)
    finally:
        unregister("siirl.rollouts", "spec_fake")
    out = result.outputs["my_custom_node"].batch
    assert torch.equal(out["doubled"], (torch.arange(6).view(3, 2) + 100) * 2)
    assert result.metrics["metric_name"] == 1.5
    assert "timing_s/rollout_actor" in result.metrics


def test_extension_point_node_passes_batch(user_modules):
    import my_module

    batch = make_batch({"x": torch.ones(2)})
    out = my_module.my_node(batch)
    assert out.batch is batch and out.metrics == {}


def test_custom_pipeline_from_command_line(user_modules):
    # Spec: python -m siirl.main_dag dag.custom_pipeline_fn="my_module:my_custom_pipeline"
    env_path = str(user_modules)
    proc = subprocess.run(
        [sys.executable, "-m", "siirl.main_dag",
         'dag.custom_pipeline_fn=my_module:my_custom_pipeline', "--print-dag"],
        capture_output=True, text=True, env=_env(env_path), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "my_custom_node" in proc.stdout and "rollout_actor" in proc.stdout


@pytest.mark.parametrize("overrides,graph_id", [
    (["algorithm.adv_estimator=grpo"], "grpo_training_pipeline"),
    (["algorithm.adv_estimator=gae", "critic.enable=true"], "ppo_training_pipeline"),
    (["algorithm.workflow_type=DAPO", "algorithm.filter_groups.enable=true"],
     "dapo_training_pipeline"),
    (["algorithm.workflow_type=EMBODIED"], "embodied_grpo_training_pipeline"),
])
def test_builtin_usage_lines_select_their_pipeline(overrides, graph_id):
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag", *overrides, "--print-dag"],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(f"TaskGraph '{graph_id}'")


def _env(extra_path: str = ""):
    import os
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, env.get("PYTHONPATH")) if p)
    return env
