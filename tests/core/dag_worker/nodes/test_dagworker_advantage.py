"""DAGWorker.compute_advantage (the built-in ADVANTAGE node) for GRPO and GAE."""

import math
import statistics

import pytest
import torch

from siirl.dag_worker.dagworker import DAGWorker
from siirl.data_coordinator.protocol import make_batch
from siirl.errors import ConfigError, PipelineError
from siirl.execution.dag.pipeline import Pipeline
from siirl_numerics import assert_close, rounding, scale_of


def _advantage_worker(config):
    # No func: COMPUTE/ADVANTAGE runs DAGWorker.compute_advantage bound to the worker.
    graph = Pipeline("adv").add_node("adv", node_type="COMPUTE", node_role="ADVANTAGE").build()
    return DAGWorker(graph, config=config)


REWARDS = [  # outcome reward on the last response token
    [0.0, 0.0, 1.0],
    [0.0, 0.5, 0.0],
    [0.0, 0.0, 0.0],
    [0.0, 2.0, 0.0],
    [0.0, 0.0, -1.0],
    [0.0, 0.0, 3.0],
]
MASK = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1]]
UIDS = ["a", "a", "a", "b", "b", "solo"]


def grpo_tolerance(expected):
    """float32 against an exact float64 hand computation: a row's score sums its tokens, a
    group's mean and standard deviation sum its rows, then a subtraction, a square root
    and a division."""
    group = max(UIDS.count(uid) for uid in UIDS)
    terms = len(REWARDS[0]) + 2 * group + 3
    return rounding(torch.float32, terms, scale_of(expected), expected.numel())


def _grpo_batch():
    return make_batch({"token_level_rewards": torch.tensor(REWARDS),
                       "response_mask": torch.tensor(MASK, dtype=torch.long)},
                      {"uid": list(UIDS)})


def _expected_grpo(norm_by_std=True, eps=1e-6):
    scores = [math.fsum(row) for row in REWARDS]
    groups = {}
    for i, uid in enumerate(UIDS):
        groups.setdefault(uid, []).append(i)
    adv = [0.0] * len(scores)
    for rows in groups.values():
        values = [scores[i] for i in rows]
        if len(rows) == 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = statistics.fmean(values), statistics.stdev(values)
        for i in rows:
            adv[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return torch.tensor([[adv[i] * m for m in MASK[i]] for i in range(len(adv))],
                        dtype=torch.float64)


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_group_normalised(norm_by_std):
    algorithm = {"adv_estimator": "grpo"}
    if not norm_by_std:
        algorithm["norm_adv_by_std_in_grpo"] = False
    worker = _advantage_worker({"algorithm": algorithm})
    result = worker.execute_task_graph(_grpo_batch())
    out = result.outputs["adv"].batch
    expected = _expected_grpo(norm_by_std)
    assert_close(out["advantages"].double(), expected, grpo_tolerance(expected), "advantages")
    torch.testing.assert_close(out["returns"], out["advantages"])
    mask = torch.tensor(MASK, dtype=torch.bool)
    metric = result.metrics["critic/advantages/mean"]
    assert type(metric) is float
    # the advantages' rounding, then their mean over the valid tokens
    terms = len(REWARDS[0]) + 2 * len(UIDS) + 3 + int(mask.sum())
    assert_close(metric, expected[mask].mean().item(),
                 rounding(torch.float32, terms, scale_of(expected)), "critic/advantages/mean")


def test_grpo_group_with_equal_scores_gets_zero():
    batch = make_batch({"token_level_rewards": torch.tensor([[1.0], [1.0], [0.0], [2.0]]),
                        "response_mask": torch.ones(4, 1, dtype=torch.long)},
                       {"uid": ["same", "same", "diff", "diff"]})
    out = _advantage_worker({"algorithm": {"adv_estimator": "grpo"}}).compute_advantage(batch)
    assert out.batch["advantages"][:2].abs().max().item() == 0.0
    assert out.batch["advantages"][2, 0].item() < 0 < out.batch["advantages"][3, 0].item()


def test_grpo_default_estimator_and_config_argument():
    worker = _advantage_worker(None)
    out = worker.compute_advantage(_grpo_batch(), config=None)  # defaults to grpo
    expected = _expected_grpo()
    assert_close(out.batch["advantages"].double(), expected, grpo_tolerance(expected),
                 "advantages")


def test_grpo_without_uid_names_index():
    batch = make_batch({"token_level_rewards": torch.ones(2, 2),
                        "response_mask": torch.ones(2, 2, dtype=torch.long)})
    with pytest.raises(PipelineError, match="index"):
        _advantage_worker({"algorithm": {"adv_estimator": "grpo"}}).compute_advantage(batch)


GAMMA, LAM = 0.9, 0.8
G_REWARDS = [[0.1, -0.2, 1.0, 0.0], [0.3, 0.7, 0.0, 0.5]]
G_VALUES = [[0.5, 0.4, 0.2, 9.0], [0.1, 0.6, 0.3, -0.4]]
G_MASK = [[1, 1, 1, 0], [1, 0, 1, 1]]  # trailing padding; a hole in the middle


def _expected_gae():
    """Per row, GAE over the valid positions only (padding is skipped, not a boundary),
    then advantages whitened over all valid positions (unbiased variance)."""
    raw = [[0.0] * 4 for _ in G_MASK]
    returns = [[0.0] * 4 for _ in G_MASK]
    for b, mask in enumerate(G_MASK):
        valid = [t for t, m in enumerate(mask) if m]
        running, next_value = 0.0, 0.0
        for t in reversed(valid):
            delta = G_REWARDS[b][t] + GAMMA * next_value - G_VALUES[b][t]
            running = delta + GAMMA * LAM * running
            next_value = G_VALUES[b][t]
            raw[b][t] = running
            returns[b][t] = running + G_VALUES[b][t]
    flat = [raw[b][t] for b, mask in enumerate(G_MASK) for t, m in enumerate(mask) if m]
    mean = statistics.fmean(flat)
    var = statistics.variance(flat)
    adv = [[(raw[b][t] - mean) / math.sqrt(var + 1e-8) if m else 0.0
            for t, m in enumerate(mask)] for b, mask in enumerate(G_MASK)]
    return (torch.tensor(adv, dtype=torch.float64), torch.tensor(returns, dtype=torch.float64))


def test_gae_matches_hand_loop():
    config = {"algorithm": {"adv_estimator": "gae", "gamma": GAMMA, "lam": LAM}}
    batch = make_batch({"token_level_rewards": torch.tensor(G_REWARDS),
                        "values": torch.tensor(G_VALUES),
                        "response_mask": torch.tensor(G_MASK, dtype=torch.long)})
    result = _advantage_worker(config).execute_task_graph(batch)
    out = result.outputs["adv"].batch
    adv, returns = _expected_gae()
    mask = torch.tensor(G_MASK, dtype=torch.float64)
    # float32 against exact: the GAE recursion over a row (2 roundings per position), then
    # the whitening's mean and variance over every valid position, a square root, a division
    positions, valid = len(G_MASK[0]), int(mask.sum())
    terms = 2 * positions + 2 * valid + 3
    assert_close(out["advantages"].double(), adv,
                 rounding(torch.float32, terms, scale_of(adv), adv.numel()), "advantages")
    assert_close(out["returns"].double() * mask, returns,
                 rounding(torch.float32, 2 * positions, scale_of(returns), returns.numel()),
                 "returns")
    want = returns[mask.bool()].mean().item()
    assert_close(result.metrics["critic/returns/mean"], want, rounding(
        torch.float32, 2 * positions + valid, scale_of(returns)), "critic/returns/mean")


def test_gae_gamma_one_lambda_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[1.0, 2.0, 3.0]])
    values = torch.tensor([[0.5, 0.5, 0.5]])
    batch = make_batch({"token_level_rewards": rewards, "values": values,
                        "response_mask": torch.ones(1, 3, dtype=torch.long)})
    config = {"algorithm": {"adv_estimator": "gae", "gamma": 1.0, "lam": 1.0}}
    out = _advantage_worker(config).compute_advantage(batch).batch
    torch.testing.assert_close(out["returns"], torch.tensor([[6.0, 5.0, 3.0]]))


def test_gae_without_values_names_the_missing_input():
    batch = make_batch({"token_level_rewards": torch.ones(1, 2),
                        "response_mask": torch.ones(1, 2, dtype=torch.long)})
    with pytest.raises(PipelineError, match="values"):
        _advantage_worker({"algorithm": {"adv_estimator": "gae"}}).compute_advantage(batch)


def test_unknown_estimator():
    with pytest.raises(ConfigError) as info:
        _advantage_worker({"algorithm": {"adv_estimator": "nope"}}).compute_advantage(
            _grpo_batch())
    assert "nope" in str(info.value) and "grpo" in str(info.value) and "gae" in str(info.value)
