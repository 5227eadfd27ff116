"""Node: enum coercion and the node_type / node_role rules."""

import pytest
import siirl_test_pipelines as helpers

from siirl.errors import PipelineError
from siirl.execution.dag.node import Node, NodeRole, NodeType
from siirl.execution.dag.pipeline import Pipeline


@pytest.mark.parametrize("raw", ["COMPUTE", "compute", "Compute", NodeType.COMPUTE])
def test_node_type_coerced_from_name_or_value(raw):
    assert Node("n", raw).node_type is NodeType.COMPUTE


@pytest.mark.parametrize("raw,expected", [
    ("ROLLOUT", NodeRole.ROLLOUT),
    ("rollout", NodeRole.ROLLOUT),
    ("DYNAMIC_SAMPLING", NodeRole.DYNAMIC_SAMPLING),
    ("dynamic_sampling", NodeRole.DYNAMIC_SAMPLING),
    (NodeRole.CRITIC, NodeRole.CRITIC),
])
def test_node_role_coerced(raw, expected):
    assert Node("n", "MODEL_INFERENCE", raw).node_role is expected


def test_default_role_is_default():
    assert Node("n", "compute").node_role is NodeRole.DEFAULT


def test_invalid_node_type_names_node_and_value():
    with pytest.raises(PipelineError) as info:
        Node("my_node", "COMPUT")
    msg = str(info.value)
    assert "my_node" in msg and "COMPUT" in msg and "node_type" in msg
    assert "MODEL_TRAIN" in msg  # lists the valid names


def test_invalid_node_role_names_node_and_value():
    with pytest.raises(PipelineError) as info:
        Node("judge", "COMPUTE", "ROLLOUTS")
    msg = str(info.value)
    assert "judge" in msg and "ROLLOUTS" in msg and "node_role" in msg


@pytest.mark.parametrize("bad_id", ["", None, 3])
def test_node_id_must_be_non_empty_string(bad_id):
    with pytest.raises(PipelineError, match="node id"):
        Node(bad_id, "COMPUTE")


def test_string_dependency_becomes_list():
    assert Node("b", "COMPUTE", dependencies="a").dependencies == ["a"]
    assert Node("b", "COMPUTE", dependencies=None).dependencies == []


def test_model_train_reward_rejected_naming_node_type_and_role():
    node = Node("trainer", "MODEL_TRAIN", "REWARD")
    with pytest.raises(PipelineError) as info:
        node.check_type_role()
    msg = str(info.value)
    assert "trainer" in msg and "MODEL_TRAIN" in msg and "REWARD" in msg


def test_model_train_reference_is_forward_only():
    # siiRL's own workflow files write the reference's log-prob node as MODEL_TRAIN
    node = Node("ref", "MODEL_TRAIN", "REFERENCE")
    node.check_type_role()
    assert node.only_forward_compute


def test_compute_rollout_rejected():
    with pytest.raises(PipelineError) as info:
        Node("gen", "COMPUTE", "ROLLOUT").check_type_role()
    msg = str(info.value)
    assert "gen" in msg and "COMPUTE" in msg and "ROLLOUT" in msg


@pytest.mark.parametrize("node_type,node_role", [
    ("MODEL_TRAIN", "ACTOR"), ("MODEL_TRAIN", "CRITIC"), ("MODEL_INFERENCE", "ROLLOUT"),
    ("MODEL_INFERENCE", "REFERENCE"), ("MODEL_INFERENCE", "REWARD"), ("COMPUTE", "REWARD"),
    ("COMPUTE", "ADVANTAGE"), ("COMPUTE", "DYNAMIC_SAMPLING"), ("COMPUTE", "DEFAULT"),
    ("DATA_LOAD", "DEFAULT"),
])
def test_allowed_combinations(node_type, node_role):
    Node("n", node_type, node_role).check_type_role()


@pytest.mark.parametrize("node_type,node_role", [
    ("MODEL_TRAIN", "ROLLOUT"), ("MODEL_TRAIN", "ADVANTAGE"), ("MODEL_TRAIN", "DEFAULT"),
    ("MODEL_INFERENCE", "ADVANTAGE"), ("DATA_LOAD", "ROLLOUT"), ("COMPUTE", "ACTOR"),
])
def test_rejected_combinations(node_type, node_role):
    with pytest.raises(PipelineError, match=node_role):
        Node("n", node_type, node_role).check_type_role()


def test_type_role_checked_when_pipeline_is_built():
    pipeline = Pipeline("p").add_node("train_reward", func=helpers.noop,
                                      node_type="MODEL_TRAIN", node_role="REWARD")
    with pytest.raises(PipelineError, match="train_reward"):
        pipeline.build()


def test_describe_mentions_type_role_and_deps():
    node = Node("b", "COMPUTE", "ADVANTAGE", ["a"], executable_ref="m:f")
    text = node.describe()
    assert "b" in text and "COMPUTE/ADVANTAGE" in text and "a" in text and "m:f" in text
