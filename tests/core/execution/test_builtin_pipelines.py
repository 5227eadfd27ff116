"""The four built-in workflows follow the spec's node flows exactly."""

import pytest

from siirl.dag_worker.dagworker import DAGWorker
from siirl.dag_worker.nodes.dapo_filter import dynamic_sampling
from siirl.execution.dag import builtin_pipelines as bp
from siirl.execution.dag.node import NodeRole, NodeType

INFER, TRAIN, COMPUTE = NodeType.MODEL_INFERENCE, NodeType.MODEL_TRAIN, NodeType.COMPUTE
W = "siirl.dag_worker.dagworker:DAGWorker."

ROLLOUT = ("rollout_actor", INFER, NodeRole.ROLLOUT, DAGWorker.generate)
REWARD = ("function_reward", COMPUTE, NodeRole.REWARD, DAGWorker.compute_reward)
ADV = ("calculate_advantages", COMPUTE, NodeRole.ADVANTAGE, DAGWorker.compute_advantage)
OLD = ("actor_old_log_prob", INFER, NodeRole.ACTOR, DAGWorker.compute_old_log_prob)
REF = ("reference_log_prob", INFER, NodeRole.REFERENCE, DAGWorker.compute_ref_log_prob)
TRAIN_ACTOR = ("actor_train", TRAIN, NodeRole.ACTOR, DAGWorker.train_actor)
VALUE = ("critic_value", INFER, NodeRole.CRITIC, DAGWorker.compute_value)
TRAIN_CRITIC = ("critic_train", TRAIN, NodeRole.CRITIC, DAGWorker.train_critic)
DAPO = ("dynamic_sampling", COMPUTE, NodeRole.DYNAMIC_SAMPLING, dynamic_sampling)

FLOWS = {
    "grpo": (bp.grpo_pipeline, [ROLLOUT, REWARD, ADV, OLD, REF, TRAIN_ACTOR]),
    "ppo": (bp.ppo_pipeline, [ROLLOUT, REWARD, VALUE, ADV, OLD, REF, TRAIN_ACTOR,
                              TRAIN_CRITIC]),
    "dapo": (bp.dapo_pipeline, [ROLLOUT, REWARD, DAPO, ADV, OLD, REF, TRAIN_ACTOR]),
}


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_builtin_node_order(name):
    factory, flow = FLOWS[name]
    graph = factory()
    expected_ids = [step[0] for step in flow]
    assert graph.get_execution_order() == expected_ids
    assert list(graph.nodes) == expected_ids


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_builtin_is_a_linear_chain(name):
    factory, flow = FLOWS[name]
    graph = factory()
    previous = None
    for node_id, *_ in flow:
        assert graph.nodes[node_id].dependencies == ([previous] if previous else [])
        previous = node_id
    assert graph.get_entry_nodes() == [flow[0][0]]
    assert graph.get_exit_nodes() == [flow[-1][0]]


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_builtin_types_roles_and_functions(name):
    factory, flow = FLOWS[name]
    graph = factory()
    for node_id, node_type, node_role, func in flow:
        node = graph.nodes[node_id]
        assert (node.node_type, node.node_role) == (node_type, node_role), node_id
        assert node.executable is func, node_id
        assert node.only_forward_compute is False
        node.check_type_role()
        if func.__qualname__.startswith("DAGWorker."):
            assert node.executable_ref == W + func.__name__


def test_ppo_is_grpo_plus_critic_nodes():
    grpo_ids = bp.grpo_pipeline().get_execution_order()
    ppo_ids = bp.ppo_pipeline().get_execution_order()
    assert [n for n in ppo_ids if n not in ("critic_value", "critic_train")] == grpo_ids
    assert ppo_ids.index("critic_value") == ppo_ids.index("function_reward") + 1
    assert ppo_ids[-1] == "critic_train"


def test_graph_ids():
    assert bp.grpo_pipeline().graph_id == "grpo_training_pipeline"
    assert bp.ppo_pipeline().graph_id == "ppo_training_pipeline"
    assert bp.dapo_pipeline().graph_id == "dapo_training_pipeline"


def test_builtins_return_fresh_graphs():
    first, second = bp.grpo_pipeline(), bp.grpo_pipeline()
    assert first == second and first is not second
    assert first.nodes["actor_train"] is not second.nodes["actor_train"]
