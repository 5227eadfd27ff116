"""Multi-agent workflow files (siiRL's MARFT format): YAML anchors, the node keys
``agent_group``/``config``/``agent_options``, and what is refused with a clear error."""

from pathlib import Path

import pytest

from siirl.errors import PipelineError
from siirl.execution.dag.config_loader import load_workflow
from siirl.execution.dag.node import Node, NodeRole, NodeType
from siirl.execution.dag.pipeline import MULTI_AGENT_ROLLOUT, Pipeline

ROOT = Path(__file__).resolve().parents[3]
MARFT = ROOT / "examples/experimental/marft/config"


@pytest.mark.parametrize("name", ["workflow_marft.yaml", "workflow_marft_code.yaml"])
def test_siirl_marft_files_load_unchanged(name):
    graph = load_workflow(MARFT / name)
    nodes = graph.nodes
    assert {n.agent_group for n in nodes.values()} == {0, 1}
    # both rollout nodes play the episode together
    assert nodes["rollout_reasoner"].executable_ref == MULTI_AGENT_ROLLOUT
    assert nodes["rollout_actor"].executable_ref == MULTI_AGENT_ROLLOUT
    assert nodes["rollout_reasoner"].config["rollout.n"] == 1  # from the YAML anchor
    assert nodes["critic_2_value"].agent_options == {"share_instance": 0}
    assert nodes["actor_1_train"].agent_options["train_cycle"] == 15
    env = nodes["rollout_actor"].agent_options["env_path"][0]
    assert Path(env.rpartition(":")[0]).is_absolute()  # resolved for workers elsewhere
    # MODEL_TRAIN/REFERENCE without only_forward_compute is the reference's forward
    assert nodes["reference_1_log_prob"].only_forward_compute
    assert nodes["reference_1_log_prob"].executable_ref.endswith("compute_ref_log_prob")
    # copies (planner, scheduler) keep the agent fields
    clone = graph.copy()
    assert clone.nodes["critic_2_value"].agent_options == {"share_instance": 0}
    assert clone.nodes["rollout_actor"].agent_group == 1


def _write(tmp_path, text):
    path = tmp_path / "wf.yaml"
    path.write_text(text)
    return path


NODE = """
  - node_id: r
    node_type: MODEL_INFERENCE
    node_role: ROLLOUT
    dependencies: []
"""


def test_only_anchored_top_level_blocks_are_allowed(tmp_path):
    ok = _write(tmp_path, "shared: &s\n  rollout.n: 1\nnodes:" + NODE + "    config: *s\n")
    assert load_workflow(ok).nodes["r"].config == {"rollout.n": 1}
    bad = _write(tmp_path, "shared:\n  rollout.n: 1\nnodes:" + NODE)
    with pytest.raises(PipelineError, match="unknown key 'shared'"):
        load_workflow(bad)


def test_unknown_agent_option_and_missing_files_are_named(tmp_path):
    bad = _write(tmp_path, "nodes:" + NODE + "    agent_options: {train_cycles: 3}\n")
    with pytest.raises(PipelineError, match="node 'r'.*unknown agent_options.*train_cycles"):
        load_workflow(bad)
    missing = _write(tmp_path, "nodes:" + NODE + "    agent_options: {process_path: nope.py}\n")
    with pytest.raises(PipelineError, match="'r'.*names 'nope.py', which does not exist"):
        load_workflow(missing)


@pytest.mark.parametrize("options, message", [
    ({"share_instance": 0}, "must name another agent group"),
    ({"share_instance": "0"}, "must name another agent group"),
    ({"train_cycle": 0}, "train_cycle=0 must be an integer >= 1"),
])
def test_agent_options_values_are_checked(options, message):
    with pytest.raises(PipelineError, match=message):
        Node("n", NodeType.MODEL_TRAIN, NodeRole.ACTOR, agent_options=options)


def test_negative_agent_group_is_refused():
    with pytest.raises(PipelineError, match="agent_group must be an integer >= 0"):
        Node("n", NodeType.COMPUTE, NodeRole.DEFAULT, agent_group=-1)


def test_single_agent_graph_keeps_the_plain_rollout():
    graph = Pipeline("p").add_node("rollout", node_type="MODEL_INFERENCE",
                                   node_role="ROLLOUT").build()
    assert graph.nodes["rollout"].executable_ref.endswith("DAGWorker.generate")
