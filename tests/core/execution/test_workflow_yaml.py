"""YAML workflows: the shipped files equal the built-ins; errors name file, node and key."""

import textwrap
from pathlib import Path

import pytest
import siirl_test_pipelines as helpers

from siirl.errors import PipelineError
from siirl.execution.dag import builtin_pipelines as bp
from siirl.execution.dag.config_loader import load_workflow

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILTINS = {
    "grpo": bp.grpo_pipeline,
    "ppo": bp.ppo_pipeline,
    "dapo": bp.dapo_pipeline,
}


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_workflow_yaml_equals_builtin(name):
    path = REPO_ROOT / "configs" / "workflows" / f"workflow_{name}.yaml"
    loaded = load_workflow(path)
    builtin = BUILTINS[name]()
    assert loaded == builtin, (loaded.structure(), builtin.structure())


def _write(tmp_path, text, name="wf.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_small_workflow_loads(tmp_path):
    path = _write(tmp_path, """
        nodes:
          - node_id: first
            node_type: compute
            node_role: default
            func: "siirl_test_pipelines:noop"
          - node_id: second
            node_type: COMPUTE
            node_role: ADVANTAGE
            dependencies: [first]
          - node_id: ref
            node_type: MODEL_TRAIN
            node_role: REFERENCE
            only_forward_compute: true
            dependencies: [second]
        """, name="my_flow.yaml")
    graph = load_workflow(str(path))
    assert graph.graph_id == "my_flow"  # defaults to the file stem
    assert graph.get_execution_order() == ["first", "second", "ref"]
    assert graph.nodes["first"].executable is helpers.noop
    assert graph.nodes["second"].executable_ref.endswith("DAGWorker.compute_advantage")
    assert graph.nodes["ref"].only_forward_compute is True
    assert graph.nodes["ref"].executable_ref.endswith("DAGWorker.compute_ref_log_prob")


def test_unknown_node_key_suggests_and_names_file_and_node(tmp_path):
    path = _write(tmp_path, """
        nodes:
          - node_id: first
            node_type: COMPUTE
            node_role: DEFAULT
            func: "siirl_test_pipelines:noop"
          - node_id: typo_node
            node_type: COMPUTE
            node_role: DEFAULT
            func: "siirl_test_pipelines:noop"
            dependecies: [first]
        """)
    with pytest.raises(PipelineError) as info:
        load_workflow(path)
    msg = str(info.value)
    assert "did you mean 'dependencies'" in msg
    assert str(path) in msg and "typo_node" in msg and "dependecies" in msg


def test_unknown_top_level_key_suggests(tmp_path):
    path = _write(tmp_path, """
        desciption: oops
        nodes:
          - {node_id: a, node_type: COMPUTE, node_role: DEFAULT, func: "siirl_test_pipelines:noop"}
        """)
    with pytest.raises(PipelineError, match="did you mean 'description'") as info:
        load_workflow(path)
    assert str(path) in str(info.value)


def test_missing_node_type(tmp_path):
    path = _write(tmp_path, """
        nodes:
          - node_id: untyped
            node_role: DEFAULT
            func: "siirl_test_pipelines:noop"
        """)
    with pytest.raises(PipelineError) as info:
        load_workflow(path)
    msg = str(info.value)
    assert "missing 'node_type'" in msg and "untyped" in msg and str(path) in msg


def test_node_without_id(tmp_path):
    path = _write(tmp_path, """
        nodes:
          - node_type: COMPUTE
            node_role: DEFAULT
        """)
    with pytest.raises(PipelineError, match="node_id"):
        load_workflow(path)


def test_bad_yaml(tmp_path):
    path = _write(tmp_path, "nodes: [unclosed, {node_id: a\n")
    with pytest.raises(PipelineError) as info:
        load_workflow(path)
    assert "not valid YAML" in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("text", ["", "just a string\n", "nodes: {a: 1}\n"])
def test_not_a_nodes_mapping(tmp_path, text):
    path = _write(tmp_path, text)
    with pytest.raises(PipelineError, match="nodes"):
        load_workflow(path)


def test_missing_file(tmp_path):
    with pytest.raises(PipelineError, match="does not exist"):
        load_workflow(tmp_path / "nope.yaml")


def test_cycle_in_yaml_names_the_file(tmp_path):
    path = _write(tmp_path, """
        dag_id: cyclic
        nodes:
          - {node_id: a, node_type: COMPUTE, node_role: DEFAULT,
             func: "siirl_test_pipelines:noop", dependencies: [b]}
          - {node_id: b, node_type: COMPUTE, node_role: DEFAULT,
             func: "siirl_test_pipelines:noop", dependencies: [a]}
        """)
    with pytest.raises(PipelineError) as info:
        load_workflow(path)
    msg = str(info.value)
    assert str(path) in msg and "cycle" in msg and "'cyclic'" in msg


def test_node_error_is_wrapped_with_file_and_node(tmp_path):
    path = _write(tmp_path, """
        nodes:
          - {node_id: nofunc, node_type: COMPUTE, node_role: DEFAULT}
        """)
    with pytest.raises(PipelineError) as info:
        load_workflow(path)
    msg = str(info.value)
    assert str(path) in msg and "nofunc" in msg and "COMPUTE/DEFAULT" in msg


def test_bad_enum_in_yaml_names_file_and_node(tmp_path):
    path = _write(tmp_path, """
        nodes:
          - {node_id: weird, node_type: COMPUTE, node_role: JUDGE}
        """)
    with pytest.raises(PipelineError) as info:
        load_workflow(path)
    msg = str(info.value)
    assert str(path) in msg and "weird" in msg and "JUDGE" in msg


def test_scalar_dependency_in_yaml(tmp_path):
    path = _write(tmp_path, """
        nodes:
          - {node_id: first, node_type: COMPUTE, node_role: DEFAULT,
             func: "siirl_test_pipelines:noop"}
          - {node_id: second, node_type: COMPUTE, node_role: DEFAULT,
             func: "siirl_test_pipelines:noop", dependencies: first}
        """)
    assert load_workflow(path).nodes["second"].dependencies == ["first"]
