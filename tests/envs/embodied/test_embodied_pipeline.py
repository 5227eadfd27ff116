"""The EMBODIED workflow that siirl-envs registers: its flow, its YAML twin, its selection."""

from pathlib import Path

from siirl.environment.embodied.pipeline import embodied_pipeline
from siirl.execution.dag.config_loader import load_workflow
from siirl.execution.dag.node import NodeRole
from siirl.execution.dag.task_loader import load_pipeline
from siirl.params.typed import to_typed
from siirl.plugins import load_plugin

REPO = Path(__file__).resolve().parents[3]


def test_flow_matches_the_spec():
    graph = embodied_pipeline()
    order = graph.get_execution_order()
    assert order == ["rollout_actor", "embodied_sampling", "function_reward",
                     "calculate_advantages", "actor_old_log_prob", "reference_log_prob",
                     "actor_train"]
    rollout = graph.nodes["rollout_actor"]
    assert rollout.node_role is NodeRole.ROLLOUT
    assert rollout.executable_ref == "siirl.environment.embodied.rollout_node:embodied_rollout"


def test_selected_by_workflow_type_and_registered():
    config = to_typed({"algorithm": {"workflow_type": "EMBODIED"}})
    assert load_pipeline(config) == embodied_pipeline()
    assert load_plugin("siirl.pipelines", "embodied") is embodied_pipeline


def test_yaml_twin_equals_the_builtin():
    loaded = load_workflow(REPO / "configs" / "workflows" / "workflow_embodied.yaml")
    assert loaded == embodied_pipeline(), (loaded.structure(), embodied_pipeline().structure())
