"""DAGWorker on COMPUTE-only graphs: data flow, merging, metrics, binding, errors."""

import json

import pytest
import torch

import siirl_dagworker_helpers as h
from siirl.dag_worker.dagworker import DAGWorker
from siirl.dag_worker.data_structures import NodeOutput, StepResult
from siirl.dag_worker.walk.node_executor import NodeExecutionError
from siirl.dag_worker.walk.trainer_loop import Trainer
from siirl.data_coordinator.protocol import make_batch
from siirl.errors import DataError, PipelineError, SiirlError
from siirl.execution.dag.node import Node
from siirl.execution.dag.pipeline import Pipeline

M = "siirl_dagworker_helpers:"


@pytest.fixture(autouse=True)
def _reset_helpers():
    h.CALLS.clear()
    h.Stateful.instances = 0
    yield
    h.CALLS.clear()


def _graph(*nodes, graph_id="g"):
    """nodes: (node_id, func, deps)."""
    pipeline = Pipeline(graph_id)
    for node_id, func, deps in nodes:
        pipeline.add_node(node_id, func=func, deps=deps)
    return pipeline.build()


def _calls(tag):
    return [call[1:] if len(call) > 2 else call[1] for call in h.CALLS if call[0] == tag]


def _x(batch):
    return batch["x"].tolist()


# ---- data flow -------------------------------------------------------------------------

@pytest.mark.parametrize("as_string", [True, False])
def test_data_flows_along_edges(as_string):
    def f(name):
        return M + name if as_string else getattr(h, name)
    graph = _graph(("src", f("source"), []), ("plus", f("add_one"), ["src"]),
                   ("double", f("times_two"), ["plus"]))
    result = DAGWorker(graph).execute_task_graph()
    assert isinstance(result, StepResult)
    assert list(result.outputs) == ["double"]
    assert _x(result.outputs["double"].batch) == [2.0, 4.0, 6.0, 8.0]


def test_entry_node_receives_the_given_batch():
    graph = _graph(("src", M + "source", []), ("plus", M + "add_one", ["src"]))
    batch = make_batch({"x": torch.tensor([10.0, 20.0])})
    result = DAGWorker(graph).execute_task_graph(batch)
    assert _calls("source") == [batch]
    assert _x(result.outputs["plus"].batch) == [11.0, 21.0]
    assert _x(batch) == [10.0, 20.0]  # helpers never mutate their input


def test_lambda_and_closure_nodes_run():
    graph = _graph(("src", M + "source", []),
                   ("lam", lambda batch, config=None: NodeOutput(batch=batch[:1]), ["src"]))
    result = DAGWorker(graph).execute_task_graph()
    assert _x(result.outputs["lam"].batch) == [0.0]


@pytest.mark.parametrize("order,shared", [(["l", "r"], 2.0), (["r", "l"], 1.0)])
def test_two_parents_are_merged_later_parent_wins(order, shared):
    graph = _graph(("src", M + "source", []), ("l", M + "left", ["src"]),
                   ("r", M + "right", ["src"]), ("join", M + "record", order))
    result = DAGWorker(graph).execute_task_graph()
    (merged,) = _calls("record")
    assert set(merged.keys()) == {"x", "shared", "left_only", "right_only"}
    assert merged["shared"].tolist() == [shared] * 4
    assert merged["left_only"].tolist() == [10.0] * 4
    assert merged["right_only"].tolist() == [20.0] * 4
    assert merged.batch_size == torch.Size([4])
    assert result.outputs["join"].batch is merged


def test_parents_with_different_batch_sizes_cannot_merge():
    graph = _graph(("src", M + "source", []), ("cut", M + "shorter", ["src"]),
                   ("keep", M + "record", ["src"]), ("join", M + "record", ["cut", "keep"]))
    with pytest.raises(PipelineError, match="'join'"):
        DAGWorker(graph).execute_task_graph()


def test_none_batch_passes_input_on():
    graph = _graph(("src", M + "source", []), ("skip", M + "passthrough", ["src"]),
                   ("end", M + "record", ["skip"]))
    batch = make_batch({"x": torch.tensor([5.0])})
    result = DAGWorker(graph).execute_task_graph(batch)
    assert _calls("record") == [batch]
    assert result.outputs["end"].batch is batch


def test_exit_node_returning_none_reports_its_input():
    graph = _graph(("src", M + "source", []), ("skip", M + "passthrough", ["src"]))
    batch = make_batch({"x": torch.tensor([5.0])})
    result = DAGWorker(graph).execute_task_graph(batch)
    assert result.outputs["skip"].batch is batch
    assert result.outputs["skip"].metrics == {"pass/count": 1}


def test_several_exit_nodes():
    graph = _graph(("src", M + "source", []), ("a", M + "add_one", ["src"]),
                   ("b", M + "times_two", ["src"]))
    result = DAGWorker(graph).execute_task_graph()
    assert set(result.outputs) == {"a", "b"}
    assert _x(result.outputs["a"].batch) == [1.0, 2.0, 3.0, 4.0]
    assert _x(result.outputs["b"].batch) == [0.0, 2.0, 4.0, 6.0]


# ---- metrics ---------------------------------------------------------------------------

def test_metrics_timing_and_scalars():
    graph = _graph(("src", M + "source", []), ("met", M + "tensor_metrics", ["src"]),
                   ("skip", M + "passthrough", ["met"]))
    metrics = DAGWorker(graph).execute_task_graph().metrics
    timing = {k for k in metrics if k.startswith("timing_s/")}
    assert timing == {"timing_s/src", "timing_s/met", "timing_s/skip", "timing_s/step"}
    assert all(type(v) is float for v in metrics.values()), metrics
    assert metrics["m/scalar"] == 2.5
    assert metrics["m/vector"] == 2.0
    assert metrics["m/int"] == 3.0
    assert metrics["m/list"] == 2.0
    assert metrics["m/bool"] == 1.0
    assert metrics["pass/count"] == 1.0
    assert all(metrics[k] >= 0 for k in timing)
    assert metrics["timing_s/step"] >= max(metrics[k] for k in timing - {"timing_s/step"})


def test_metrics_reset_between_steps():
    calls = []

    def once(batch, config=None):
        calls.append(1)
        return NodeOutput(batch=batch, metrics={"once/flag": 1} if len(calls) == 1 else {})

    worker = DAGWorker(_graph(("src", M + "source", []), ("once", once, ["src"])))
    first = worker.execute_task_graph().metrics
    second = worker.execute_task_graph().metrics
    assert first["once/flag"] == 1.0
    assert "once/flag" not in second
    assert set(second) == {"timing_s/src", "timing_s/once", "timing_s/step"}


# ---- errors ----------------------------------------------------------------------------

def test_non_node_output_is_a_pipeline_error():
    graph = _graph(("src", M + "source", []), ("bad_node", M + "not_node_output", ["src"]))
    with pytest.raises(PipelineError) as info:
        DAGWorker(graph).execute_task_graph()
    msg = str(info.value)
    assert "'bad_node'" in msg and "dict" in msg and "NodeOutput" in msg


def test_raising_node_gives_node_execution_error():
    graph = _graph(("src", M + "source", []), ("exploder", M + "boom", ["src"]))
    with pytest.raises(NodeExecutionError) as info:
        DAGWorker(graph).execute_task_graph()
    msg = str(info.value)
    assert "'exploder'" in msg and "ValueError" in msg and "kaboom 42" in msg
    assert "siirl_dagworker_helpers:boom" in msg
    assert isinstance(info.value, SiirlError)
    assert isinstance(info.value.__cause__, ValueError)


def test_siirl_error_from_a_node_is_prefixed_with_the_node():
    graph = _graph(("src", M + "source", []), ("loader", M + "data_error", ["src"]))
    with pytest.raises(DataError) as info:
        DAGWorker(graph).execute_task_graph()
    assert str(info.value) == "node 'loader': bad row 7"


def test_worker_validates_its_graph():
    pipeline_graph = _graph(("a", M + "source", []))
    pipeline_graph.add_node(Node("b", "COMPUTE", dependencies=["b"],
                                 executable=h.record, executable_ref=M + "record"))
    with pytest.raises(PipelineError, match="itself"):
        DAGWorker(pipeline_graph)


# ---- binding of "module:Class.method" ----------------------------------------------------

def test_staticmethod_reference():
    graph = _graph(("src", M + "source", []), ("st", M + "StaticOps.inc", ["src"]))
    result = DAGWorker(graph).execute_task_graph()
    assert _x(result.outputs["st"].batch) == [100.0, 101.0, 102.0, 103.0]


def test_instance_method_class_built_once_per_worker():
    graph = _graph(("src", M + "source", []), ("c1", M + "Stateful.count", ["src"]),
                   ("c2", M + "Stateful.count_again", ["c1"]))
    worker = DAGWorker(graph)
    for _ in range(3):
        worker.execute_task_graph()
    assert h.Stateful.instances == 1
    seen = _calls("stateful")
    assert len(seen) == 6
    assert len({id(instance) for instance, _ in seen}) == 1
    assert [n for _, n in seen] == [1, 2, 3, 4, 5, 6]

    other = DAGWorker(graph)
    other.execute_task_graph()
    assert h.Stateful.instances == 2


def test_instance_method_class_needing_arguments():
    graph = _graph(("src", M + "source", []), ("needy", M + "NeedsArgs.run", ["src"]))
    with pytest.raises(PipelineError) as info:
        DAGWorker(graph).execute_task_graph()
    assert "'needy'" in str(info.value) and "NeedsArgs" in str(info.value)


@pytest.mark.parametrize("as_string", [True, False])
def test_worker_subclass_method_bound_to_executing_worker(as_string):
    func = M + "MyWorker.double" if as_string else h.MyWorker.double
    graph = _graph(("src", M + "source", []), ("dbl", func, ["src"]))
    worker = DAGWorker(graph)
    assert type(worker) is DAGWorker
    result = worker.execute_task_graph()
    assert _calls("self") == [worker]
    assert _x(result.outputs["dbl"].batch) == [0.0, 2.0, 4.0, 6.0]


def test_bound_callables_are_cached_per_node():
    graph = _graph(("src", M + "source", []), ("dbl", M + "MyWorker.double", ["src"]))
    worker = DAGWorker(graph)
    first = worker.executor.callable_for(graph.nodes["dbl"])
    assert worker.executor.callable_for(graph.nodes["dbl"]) is first
    assert first.__self__ is worker


# ---- keyword arguments -----------------------------------------------------------------

def test_kwargs_are_filtered_by_signature():
    config = {"algorithm": {"adv_estimator": "grpo"}}
    graph = _graph(("src", M + "source", []), ("cfg", M + "only_config", ["src"]),
                   ("nd", M + "wants_node", ["cfg"]), ("wk", M + "wants_worker", ["nd"]),
                   ("kw", M + "takes_kwargs", ["wk"]))
    worker = DAGWorker(graph, config=config)
    worker.execute_task_graph()
    assert _calls("config") == [worker.config]  # the config typed once, by the worker
    (node,) = _calls("node")
    assert isinstance(node, Node) and node.node_id == "nd" and node is worker.taskgraph.nodes["nd"]
    assert _calls("worker") == [worker]
    (kwargs,) = _calls("kwargs")
    assert set(kwargs) == {"node", "worker"}
    assert kwargs["worker"] is worker and kwargs["node"] is worker.taskgraph.nodes["kw"]


# ---- steps -----------------------------------------------------------------------------

def test_trainer_runs_steps_and_logs_each(tmp_path):
    graph = _graph(("src", M + "source", []), ("plus", M + "add_one", ["src"]))
    config = {"trainer": {"total_training_steps": 3, "default_local_dir": str(tmp_path),
                          "logger": [], "save_freq": -1, "test_freq": -1}}
    worker = DAGWorker(graph, config, rank=1, world_size=2)
    history = Trainer(worker).fit()
    assert worker.global_step == 3
    assert [m["step"] for m in history] == [1, 2, 3]
    assert all("timing_s/step" in m for m in history)
    assert _calls("source") == [None, None, None]  # no dataset: entry nodes get None
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    assert "rank=1/2" in repr(worker)


def test_zero_steps_run_nothing(tmp_path):
    config = {"trainer": {"total_training_steps": 0, "default_local_dir": str(tmp_path),
                          "logger": [], "val_before_train": False}}
    worker = DAGWorker(_graph(("src", M + "source", [])), config)
    assert Trainer(worker).fit() == []
    assert worker.global_step == 0
