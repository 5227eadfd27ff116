"""Pipeline builder and TaskGraph: validation errors, ordering, adjacency, default funcs."""

import pytest
import siirl_test_pipelines as helpers

from siirl.dag_worker.dagworker import DAGWorker
from siirl.errors import PipelineError
from siirl.execution.dag.func_ref import FUNCTION, INSTANCE_METHOD, STATIC, resolve_ref
from siirl.execution.dag.node import Node, NodeType
from siirl.execution.dag.pipeline import Pipeline
from siirl.execution.dag.task_graph import TaskGraph

NOOP = helpers.noop


def _pipeline(spec, pipeline_id="p"):
    """spec: list of (node_id, deps) for COMPUTE nodes running ``noop``."""
    pipeline = Pipeline(pipeline_id)
    for node_id, deps in spec:
        pipeline.add_node(node_id, func=NOOP, deps=deps)
    return pipeline


def _cycle_names(message):
    assert "cycle" in message
    return {name.strip() for name in message.split("nodes:")[1].split(",")}


# ---- builder ---------------------------------------------------------------------------

def test_add_node_chains_and_returns_the_pipeline():
    pipeline = Pipeline("p", "desc")
    assert pipeline.add_node("a", func=NOOP) is pipeline
    graph = pipeline.add_node("b", func=NOOP, deps=["a"]).add_node("c", func=NOOP,
                                                                    deps=["b"]).build()
    assert isinstance(graph, TaskGraph)
    assert graph.graph_id == "p" and graph.description == "desc"
    assert graph.get_execution_order() == ["a", "b", "c"]


def test_duplicate_id_in_pipeline_names_the_id():
    pipeline = Pipeline("p").add_node("dup_node", func=NOOP)
    with pytest.raises(PipelineError, match="duplicate node id 'dup_node'"):
        pipeline.add_node("dup_node", func=NOOP)


def test_duplicate_id_in_taskgraph_names_the_id():
    graph = TaskGraph("g").add_node(Node("x", "COMPUTE"))
    with pytest.raises(PipelineError, match="duplicate node id 'x'"):
        graph.add_node(Node("x", "COMPUTE"))


def test_missing_dependency_names_node_and_dep():
    pipeline = _pipeline([("a", []), ("needy", ["a", "ghost"])])
    with pytest.raises(PipelineError) as info:
        pipeline.build()
    msg = str(info.value)
    assert "'needy'" in msg and "'ghost'" in msg


def test_dependency_listed_twice_is_an_error():
    with pytest.raises(PipelineError, match="twice"):
        _pipeline([("a", []), ("b", ["a", "a"])]).build()


@pytest.mark.parametrize("spec", [
    # an unrelated acyclic node before the cycle
    [("extra", []), ("a", ["c"]), ("b", ["a"]), ("c", ["b"])],
    # a node hanging off the cycle (downstream)
    [("a", ["c"]), ("b", ["a"]), ("c", ["b"]), ("extra", ["a"])],
    # a node feeding the cycle (upstream), visited first
    [("extra", []), ("a", ["c", "extra"]), ("b", ["a"]), ("c", ["b"])],
])
def test_cycle_error_lists_exactly_the_cycle(spec):
    with pytest.raises(PipelineError) as info:
        _pipeline(spec, "cyc").build()
    msg = str(info.value)
    assert "'cyc'" in msg
    assert _cycle_names(msg) == {"a", "b", "c"}


def test_two_node_cycle():
    with pytest.raises(PipelineError) as info:
        _pipeline([("x", ["y"]), ("y", ["x"])]).build()
    assert _cycle_names(str(info.value)) == {"x", "y"}


def test_self_dependency():
    with pytest.raises(PipelineError, match="'selfish' depends on itself"):
        _pipeline([("selfish", ["selfish"])]).build()


def test_empty_graph_is_an_error():
    with pytest.raises(PipelineError, match="no nodes"):
        Pipeline("empty").build()


# ---- function references ---------------------------------------------------------------

def test_unimportable_module_names_module_and_node():
    pipeline = Pipeline("p").add_node("n1", func="no_such_module_xyz:f")
    with pytest.raises(PipelineError) as info:
        pipeline.build()
    msg = str(info.value)
    assert "no_such_module_xyz" in msg and "'n1'" in msg


def test_missing_attribute_names_module_and_attribute():
    pipeline = Pipeline("p").add_node("n1", func="siirl_test_pipelines:does_not_exist")
    with pytest.raises(PipelineError) as info:
        pipeline.build()
    msg = str(info.value)
    assert "siirl_test_pipelines" in msg and "does_not_exist" in msg and "'n1'" in msg


def test_missing_method_names_the_class():
    pipeline = Pipeline("p").add_node("n1", func="siirl_test_pipelines:Steps.nope")
    with pytest.raises(PipelineError) as info:
        pipeline.build()
    msg = str(info.value)
    assert "Steps" in msg and "nope" in msg and "class" in msg


@pytest.mark.parametrize("ref", ["nocolon", "a:b:c", "siirl_test_pipelines:Steps.run.x",
                                 "siirl_test_pipelines:"])
def test_malformed_reference(ref):
    with pytest.raises(PipelineError) as info:
        Pipeline("p").add_node("n1", func=ref).build()
    assert ref in str(info.value) and "'n1'" in str(info.value)


def test_reference_to_a_class_or_value_is_not_a_function():
    with pytest.raises(PipelineError, match="not a function"):
        resolve_ref("siirl_test_pipelines:Steps", "here")
    with pytest.raises(PipelineError, match="not a function"):
        resolve_ref("siirl_test_pipelines:CONSTANT", "here")


def test_resolve_ref_kinds():
    assert resolve_ref("siirl_test_pipelines:noop", "w").kind == FUNCTION
    static = resolve_ref("siirl_test_pipelines:Steps.static_run", "w")
    assert static.kind == STATIC and static.owner is helpers.Steps
    method = resolve_ref("siirl_test_pipelines:Steps.run", "w")
    assert method.kind == INSTANCE_METHOD and method.func is helpers.Steps.run
    worker = resolve_ref("siirl.dag_worker.dagworker:DAGWorker.generate", "w")
    assert worker.kind == "worker" and worker.func is DAGWorker.generate


def test_missing_attribute_on_a_plain_object_is_a_pipeline_error():
    with pytest.raises(PipelineError, match="nope"):
        resolve_ref("siirl_test_pipelines:CONSTANT.nope", "node 'n1'")


def test_callable_func_records_its_reference():
    graph = Pipeline("p").add_node("n", func=NOOP).build()
    node = graph.nodes["n"]
    assert node.executable is NOOP
    assert node.executable_ref == "siirl_test_pipelines:noop"


def test_string_func_is_resolved_on_build():
    graph = Pipeline("p").add_node("n", func="siirl_test_pipelines:Steps.static_run").build()
    assert graph.nodes["n"].executable is helpers.Steps.static_run


def test_func_of_wrong_type_is_an_error():
    with pytest.raises(PipelineError, match="'n'.*int"):
        Pipeline("p").add_node("n", func=42)


def test_string_dependency_in_add_node():
    graph = (Pipeline("p").add_node("first", func=NOOP)
             .add_node("second", func=NOOP, deps="first").build())
    assert graph.nodes["second"].dependencies == ["first"]


# ---- default functions -----------------------------------------------------------------

def test_default_func_for_model_train_actor_is_train_actor():
    graph = Pipeline("p").add_node("train", node_type="MODEL_TRAIN", node_role="ACTOR").build()
    node = graph.nodes["train"]
    assert node.executable is DAGWorker.train_actor
    assert node.executable_ref == "siirl.dag_worker.dagworker:DAGWorker.train_actor"


@pytest.mark.parametrize("node_type,node_role,forward,method", [
    ("MODEL_INFERENCE", "ROLLOUT", False, "generate"),
    ("COMPUTE", "REWARD", False, "compute_reward"),
    ("COMPUTE", "ADVANTAGE", False, "compute_advantage"),
    ("MODEL_INFERENCE", "ACTOR", False, "compute_old_log_prob"),
    ("MODEL_TRAIN", "ACTOR", True, "compute_old_log_prob"),
    ("MODEL_INFERENCE", "REFERENCE", False, "compute_ref_log_prob"),
    ("MODEL_TRAIN", "REFERENCE", True, "compute_ref_log_prob"),
    ("MODEL_INFERENCE", "CRITIC", False, "compute_value"),
    ("MODEL_TRAIN", "CRITIC", False, "train_critic"),
])
def test_default_funcs(node_type, node_role, forward, method):
    graph = Pipeline("p").add_node("n", node_type=node_type, node_role=node_role,
                                   only_forward_compute=forward).build()
    assert graph.nodes["n"].executable is getattr(DAGWorker, method)


def test_compute_default_node_without_func_is_an_error():
    with pytest.raises(PipelineError) as info:
        Pipeline("p").add_node("plain", node_type="COMPUTE", node_role="DEFAULT")
    msg = str(info.value)
    assert "'plain'" in msg and "COMPUTE/DEFAULT" in msg


# ---- ordering and adjacency ------------------------------------------------------------

def test_execution_order_is_topological_regardless_of_insertion():
    graph = _pipeline([("c", ["b"]), ("a", []), ("b", ["a"])]).build()
    assert graph.get_execution_order() == ["a", "b", "c"]


def test_independent_nodes_keep_insertion_order():
    graph = _pipeline([("z", []), ("x", []), ("y", [])]).build()
    assert graph.get_execution_order() == ["z", "x", "y"]


def test_execution_order_is_deterministic():
    spec = [("r", []), ("q", ["r"]), ("p", ["r"]), ("o", ["q", "p"]), ("s", [])]
    orders = {tuple(_pipeline(spec).build().get_execution_order()) for _ in range(5)}
    assert len(orders) == 1
    order = list(orders.pop())
    for node_id, deps in spec:
        assert all(order.index(dep) < order.index(node_id) for dep in deps)


@pytest.mark.parametrize("middle,expected", [
    (["b", "c"], ["a", "b", "c", "d"]),
    (["c", "b"], ["a", "c", "b", "d"]),
])
def test_diamond(middle, expected):
    pipeline = Pipeline("diamond").add_node("a", func=NOOP)
    for node_id in middle:
        pipeline.add_node(node_id, func=NOOP, deps=["a"])
    graph = pipeline.add_node("d", func=NOOP, deps=["b", "c"]).build()
    assert graph.get_execution_order() == expected
    assert sorted(graph.adj["a"]) == ["b", "c"]
    assert graph.rev_adj["d"] == ["b", "c"]
    assert graph.adj["d"] == [] and graph.rev_adj["a"] == []
    assert graph.get_entry_nodes() == ["a"]
    assert graph.get_exit_nodes() == ["d"]


def test_build_adjacency_lists_fills_adj_and_rev_adj():
    graph = TaskGraph("g").add_nodes([
        Node("a", "COMPUTE"), Node("b", "COMPUTE", dependencies=["a"]),
        Node("c", "COMPUTE", dependencies=["a", "b"]),
    ])
    assert graph.adj == {} and graph.rev_adj == {}
    graph.build_adjacency_lists()
    assert graph.adj == {"a": ["b", "c"], "b": ["c"], "c": []}
    assert graph.rev_adj == {"a": [], "b": ["a"], "c": ["a", "b"]}


def test_build_adjacency_lists_skips_unknown_dependency():
    graph = TaskGraph("g").add_nodes([Node("a", "COMPUTE", dependencies=["ghost"])])
    graph.build_adjacency_lists()
    assert graph.adj == {"a": []} and graph.rev_adj == {"a": []}


def test_get_node():
    graph = _pipeline([("a", [])]).build()
    assert graph.get_node("a") is graph.nodes["a"]
    assert graph.get_node("zzz") is None


# ---- equality and copies ---------------------------------------------------------------

def test_graph_equality_is_structural():
    spec = [("a", []), ("b", ["a"])]
    first, second = _pipeline(spec, "one").build(), _pipeline(spec, "two").build()
    assert first == second
    assert first != _pipeline([("a", []), ("b", [])]).build()
    assert first != _pipeline([("a", []), ("bb", ["a"])]).build()
    assert first != "not a graph"


def test_copy_is_equal_and_independent():
    graph = _pipeline([("a", []), ("b", ["a"])]).build()
    clone = graph.copy("clone")
    assert clone == graph and clone.graph_id == "clone"
    assert clone.nodes["b"] is not graph.nodes["b"]
    clone.nodes["b"].dependencies.append("x")
    assert graph.nodes["b"].dependencies == ["a"]
    assert clone.nodes["a"].node_type is NodeType.COMPUTE


def test_format_lists_nodes_in_order():
    text = _pipeline([("a", []), ("b", ["a"])], "fmt").build().format()
    lines = text.splitlines()
    assert "fmt" in lines[0]
    assert lines[1].strip().startswith("a ") and lines[2].strip().startswith("b ")


def test_ready_nodes_run_in_insertion_order():
    # b waits for a; c is independent and was added after b, so b still runs before c.
    graph = _pipeline([("a", []), ("b", ["a"]), ("c", [])]).build()
    assert graph.get_execution_order() == ["a", "b", "c"]
