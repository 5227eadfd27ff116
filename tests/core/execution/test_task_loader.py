"""task_loader.load_pipeline: which workflow a config selects, in priority order."""

import importlib
import textwrap

import pytest

from siirl.errors import ConfigError, PipelineError, PluginNotFoundError
from siirl.execution.dag import builtin_pipelines as bp
from siirl.execution.dag.task_graph import TaskGraph
from siirl.execution.dag.task_loader import builtin_pipeline_name, load_pipeline
from siirl.params.typed import to_typed

CUSTOM = "siirl_test_pipelines:custom_pipeline"


@pytest.fixture
def yaml_path(tmp_path):
    path = tmp_path / "from_yaml.yaml"
    path.write_text(textwrap.dedent("""
        dag_id: yaml_flow
        nodes:
          - {node_id: y, node_type: COMPUTE, node_role: DEFAULT,
             func: "siirl_test_pipelines:noop"}
        """))
    return path


def test_helper_module_importable_from_test_dir():
    # rootdir mode without __init__.py puts this test's directory on sys.path
    assert importlib.import_module("siirl_test_pipelines").custom_pipeline


def test_custom_fn_wins_over_workflow_path_and_type(yaml_path):
    config = {"dag": {"custom_pipeline_fn": CUSTOM, "workflow_path": str(yaml_path),
                      "pipeline": "ppo"},
              "algorithm": {"workflow_type": "DAPO", "adv_estimator": "gae"}}
    graph = load_pipeline(to_typed(config))
    assert isinstance(graph, TaskGraph)  # a returned Pipeline is built
    assert graph.graph_id == "custom_from_fn"
    assert graph.get_execution_order() == ["first", "second"]


def test_custom_fn_returning_a_taskgraph():
    graph = load_pipeline(to_typed({"dag": {
            "custom_pipeline_fn": "siirl_test_pipelines:custom_graph"}}))
    assert graph.graph_id == "custom_graph_fn"


def test_custom_fn_returning_something_else_is_an_error():
    with pytest.raises(PipelineError) as info:
        load_pipeline(to_typed({"dag": {
            "custom_pipeline_fn": "siirl_test_pipelines:not_a_graph"}}))
    msg = str(info.value)
    assert "siirl_test_pipelines:not_a_graph" in msg and "int" in msg and "TaskGraph" in msg


def test_custom_fn_that_does_not_resolve():
    with pytest.raises(PipelineError) as info:
        load_pipeline(to_typed({"dag": {
            "custom_pipeline_fn": "siirl_test_pipelines:missing_fn"}}))
    assert "dag.custom_pipeline_fn" in str(info.value) and "missing_fn" in str(info.value)


def test_workflow_path_wins_over_pipeline_and_type(yaml_path):
    config = {"dag": {"workflow_path": str(yaml_path), "pipeline": "ppo"},
              "algorithm": {"workflow_type": "DAPO"}}
    assert load_pipeline(to_typed(config)).graph_id == "yaml_flow"


def test_dag_pipeline_wins_over_workflow_type():
    config = {"dag": {"pipeline": "ppo"}, "algorithm": {"workflow_type": "DAPO"}}
    assert load_pipeline(to_typed(config)) == bp.ppo_pipeline()


def test_unknown_dag_pipeline_names_the_key():
    with pytest.raises(PluginNotFoundError) as info:
        load_pipeline(to_typed({"dag": {"pipeline": "no_such_flow"}}))
    assert "dag.pipeline" in str(info.value) and "no_such_flow" in str(info.value)


def test_empty_values_fall_through():
    config = {"dag": {"custom_pipeline_fn": "", "workflow_path": None},
              "algorithm": {"workflow_type": "DAPO"}}
    assert load_pipeline(to_typed(config)) == bp.dapo_pipeline()


@pytest.mark.parametrize("config,expected", [
    ({"algorithm": {"workflow_type": "DAPO"}}, bp.dapo_pipeline),
    ({"algorithm": {"workflow_type": "dapo", "adv_estimator": "gae"}}, bp.dapo_pipeline),
    ({"algorithm": {"workflow_type": "DEFAULT", "adv_estimator": "gae"}}, bp.ppo_pipeline),
    ({"algorithm": {"adv_estimator": "GAE"}}, bp.ppo_pipeline),
    ({"algorithm": {"adv_estimator": "grpo"}}, bp.grpo_pipeline),
    ({"algorithm": {"adv_estimator": "cpgd"}}, bp.grpo_pipeline),
    ({"algorithm": {"adv_estimator": "gspo"}}, bp.grpo_pipeline),
    ({}, bp.grpo_pipeline),
    (None, bp.grpo_pipeline),
])
def test_builtin_selection(config, expected):
    graph = load_pipeline(to_typed(config))
    assert graph == expected()
    assert graph.graph_id == expected().graph_id


@pytest.mark.parametrize("config,name", [
    ({"algorithm": {"workflow_type": "DAPO"}}, "dapo"),
    ({"algorithm": {"workflow_type": "EMBODIED"}}, "embodied"),
    ({"algorithm": {"adv_estimator": "gae"}}, "ppo"),
    ({"algorithm": {"adv_estimator": "cpgd"}}, "grpo"),
])
def test_builtin_pipeline_name(config, name):
    assert builtin_pipeline_name(to_typed(config)) == name


def test_invalid_workflow_type():
    with pytest.raises(ConfigError) as info:
        load_pipeline(to_typed({"algorithm": {"workflow_type": "BOGUS"}}))
    msg = str(info.value)
    assert "algorithm.workflow_type" in msg and "BOGUS" in msg
    assert "DAPO" in msg and "EMBODIED" in msg
