"""Agent groups: per-agent settings, the view a node sees, what goes back, train turns,
and MARFT's GAE across agents."""

import pytest
import torch

from siirl.dag_worker.core_algos import get_adv_estimator_fn
from siirl.dag_worker.core_algos.advantages import compute_gae_advantage_return
from siirl.dag_worker.multi_agent.agent_groups import AgentGroups
from siirl.data_coordinator import protocol
from siirl.errors import PipelineError
from siirl.execution.dag.agent_config import group_config
from siirl.execution.dag.node import Node, NodeRole, NodeType
from siirl.execution.dag.pipeline import Pipeline
from siirl.params.typed import to_typed


def _batch():
    batch = protocol.make_batch({"agent_group_0_responses": torch.tensor([[1, 2], [3, 4]]),
                                 "agent_group_1_responses": torch.tensor([[5], [6]]),
                                 "env_scores": torch.tensor([1.0, 0.0])})
    protocol.set_non_tensor(batch, "uid", ["a", "b"])
    return batch


def test_view_shows_shared_and_own_fields_and_merge_prefixes_changes():
    batch = _batch()
    view = AgentGroups.view(batch, 1)
    assert set(view.keys()) == {"responses", "env_scores", "uid"}
    assert view["responses"].tolist() == [[5], [6]]
    before = AgentGroups.snapshot(view)
    view.set("values", torch.ones(2, 1))  # a node adding a field in place
    merged = AgentGroups.merge(batch, before, view, 1)
    assert merged["agent_group_1_values"].tolist() == [[1.0], [1.0]]
    assert "values" not in merged.keys() and "agent_group_1_env_scores" not in merged.keys()
    assert "agent_group_1_values" not in batch.keys()  # the input batch is not changed


def test_group_config_applies_node_settings_under_actor_rollout_ref():
    config = to_typed({"actor_rollout_ref": {"rollout": {"n": 4, "top_p": 1.0}}})
    nodes = [Node("a", NodeType.MODEL_TRAIN, NodeRole.ACTOR, config={"rollout.n": 1})]
    own = group_config(config, nodes, 1)
    assert own.actor_rollout_ref.rollout.n == 1 and config.actor_rollout_ref.rollout.n == 4
    # a copy along the key's path only: the other sections are the run's own objects
    assert own.actor_rollout_ref.actor is config.actor_rollout_ref.actor
    assert own.trainer is config.trainer
    typed = group_config(config, [Node("t", NodeType.MODEL_TRAIN, NodeRole.ACTOR,
                                        config={"rollout.n": "2", "rollout.val_kwargs":
                                                {"n": 3}})], 1)
    assert typed.actor_rollout_ref.rollout.n == 2  # converted to the field's type
    assert typed.actor_rollout_ref.rollout.val_kwargs.n == 3  # a mapping merges
    with pytest.raises(PipelineError, match="config key 'rollout.n'"):
        group_config(config, [Node("w", NodeType.MODEL_TRAIN, NodeRole.ACTOR,
                                    config={"rollout.n": "many"})], 1)
    with pytest.raises(PipelineError, match="node 'b'.*config key 'rollout.nn'"):
        group_config(config, [Node("b", NodeType.MODEL_TRAIN, NodeRole.ACTOR,
                                    config={"rollout.nn": 1})], 1)
    clash = nodes + [Node("c", NodeType.MODEL_TRAIN, NodeRole.ACTOR, config={"rollout.n": 2})]
    with pytest.raises(PipelineError, match="node 'c' sets config rollout.n=2"):
        group_config(config, clash, 1)


def test_train_cycle_gives_each_agent_its_turn():
    graph = (Pipeline("p")
             .add_node("a0", func=lambda b, **_: None, agent_group=0,
                       agent_options={"train_cycle": 2})
             .add_node("a1", func=lambda b, **_: None, deps=["a0"], agent_group=1,
                       agent_options={"train_cycle": 2}).build())
    agents = AgentGroups(graph, to_typed({}), worker=None)
    a0, a1 = graph.nodes["a0"], graph.nodes["a1"]
    assert [agents.skips_training(a0, s) for s in (1, 2, 3, 4, 5)] == \
        [False, False, True, True, False]
    assert [agents.skips_training(a1, s) for s in (1, 2, 3, 4, 5)] == \
        [True, True, False, False, True]
    # a node the planner left out of the steps where a0 trains (its old log-probs), and
    # one planned for the critic warm-up steps 1-2 as well
    a0_old = Node("a0_old", NodeType.MODEL_INFERENCE, NodeRole.ACTOR, while_waiting="a0")
    assert [agents.planned_out(a0_old, s) for s in (1, 2, 3, 4, 5)] == \
        [True, True, False, False, True]
    a0_old.until_step = 2
    assert [agents.planned_out(a0_old, s) for s in (1, 2, 3, 4, 5)] == \
        [False, False, False, False, True]
    assert not any(agents.planned_out(a0, s) for s in (1, 2, 3, 4, 5))  # planned as is


def test_marft_gae_runs_gae_across_the_agents_in_turn():
    torch.manual_seed(0)
    r0, r1 = torch.zeros(3, 4), torch.zeros(3, 5)
    r1[:, 2] = torch.tensor([1.0, 0.0, 2.0])
    v0, v1 = torch.randn(3, 4), torch.randn(3, 5)
    m0 = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]).float()
    m1 = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]).float()
    gamma, lam = 0.9, 0.8
    adv, ret = get_adv_estimator_fn("gae_marft")([r0, r1], [v0, v1], [m0, m1], gamma, lam)
    # by hand: agent 0's tokens, then agent 1's, one GAE per row
    for row in range(3):
        tokens = [(r0[row, t], v0[row, t], (0, t)) for t in range(4) if m0[row, t]] + \
                 [(r1[row, t], v1[row, t], (1, t)) for t in range(5) if m1[row, t]]
        running, next_value = 0.0, 0.0
        for reward, value, (agent, t) in reversed(tokens):
            running = reward + gamma * next_value - value + gamma * lam * running
            next_value = value
            expected = running + value
            got = (ret[0] if agent == 0 else ret[1])[row, t]
            assert torch.isclose(got, torch.as_tensor(expected), atol=1e-6)
    for a, m in zip(adv, (m0, m1), strict=True):  # whitened per agent, zero off the mask
        assert abs(float(a[m.bool()].mean())) < 1e-5 and float(a[~m.bool()].abs().sum()) == 0


def test_marft_gae_of_one_agent_is_gae():
    r, v = torch.zeros(2, 3), torch.randn(2, 3)
    r[:, -1] = 1.0
    m = torch.ones(2, 3)
    one = get_adv_estimator_fn("gae_marft")(r, v, m, 0.99, 0.95)
    ref = compute_gae_advantage_return(r, v, m, 0.99, 0.95)
    assert all(torch.equal(a, b) for a, b in zip(one, ref, strict=True))
