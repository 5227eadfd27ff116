"""Batch statistics over every worker's rows: each registered estimator on a batch split
over two simulated workers (threads exchanging their sums, as the gloo collectives would)
gives the one-worker result on the whole batch (``siirl_workers``).

The batch: 4 prompt groups of 3 rows, unequal lengths, one empty row (it trains nothing and
is not in B), a hole in one response; worker 0 holds the first two groups, worker 1 the rest.
"""

import pytest
import torch

from siirl.dag_worker import core_algos as ca
from siirl.dag_worker.core_algos.batch_reduction import LOCAL
from siirl.dag_worker.nodes import algorithm as algorithm_nodes
from siirl.dag_worker.walk.dag_utils import call_with_available
from siirl.errors import DataError
from siirl_workers import on_workers

ROWS, WIDTH = 12, 5
UIDS = [f"p{row // 3}" for row in range(ROWS)]


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(ROWS, WIDTH, dtype=torch.float64)
    for row, length in enumerate([5, 3, 4, 2, 5, 1, 4, 3, 5, 2, 0, 4]):
        mask[row, :length] = 1
    mask[6, 1] = 0  # a hole in the middle of a response
    rewards = torch.zeros(ROWS, WIDTH, dtype=torch.float64)
    last = (mask.sum(-1).long() - 1).clamp_min(0)
    rewards[torch.arange(ROWS), last] = torch.randint(0, 3, (ROWS,), generator=g).double()
    rewards += 0.1 * torch.randn(ROWS, WIDTH, generator=g, dtype=torch.float64) * mask
    return {"token_level_rewards": rewards * mask, "response_mask": mask,
            "values": torch.randn(ROWS, WIDTH, generator=g, dtype=torch.float64) * mask,
            "reward_baselines": torch.randn(ROWS, generator=g, dtype=torch.float64),
            "index": list(UIDS)}


def rows(sources, start, stop):
    return {k: v[start:stop] for k, v in sources.items()}


def estimate(name, sources, reduction=LOCAL):
    settings = {"gamma": 0.9, "lam": 0.8, "weight_factor_in_cpgd": "clip_filter_like_weight",
                "norm_adv_by_std_in_grpo": True, "reduction": reduction}
    return call_with_available(ca.get_adv_estimator_fn(name), {**sources, **settings},
                               f"advantage estimator '{name}'")


@pytest.mark.parametrize("name", ca.registered_adv_estimators())
def test_every_estimator_on_two_workers_equals_one(name):
    whole = batch()
    adv_one, ret_one = estimate(name, whole)
    halves = [rows(whole, 0, 6), rows(whole, 6, ROWS)]
    parts = on_workers(lambda part, reduction: estimate(name, part, reduction), halves)
    adv_two = torch.cat([adv for adv, _ in parts])
    ret_two = torch.cat([ret for _, ret in parts])
    torch.testing.assert_close(adv_two, adv_one, atol=1e-12, rtol=0)
    torch.testing.assert_close(ret_two, ret_one, atol=1e-12, rtol=0)
    # and an uneven split (one group against three)
    parts = on_workers(lambda part, reduction: estimate(name, part, reduction),
                       [rows(whole, 0, 3), rows(whole, 3, ROWS)])
    torch.testing.assert_close(torch.cat([adv for adv, _ in parts]), adv_one,
                               atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_whitening_spans_the_batch_not_the_worker(name):
    """The estimators that used to whiten each worker's rows alone: the halves whitened
    locally are not the whole batch whitened (so the test above can tell)."""
    whole = batch()
    local = torch.cat([estimate(name, rows(whole, 0, 6))[0],
                       estimate(name, rows(whole, 6, ROWS))[0]])
    assert (local - estimate(name, whole)[0]).abs().max() > 1e-3


def test_marft_whitens_each_agent_over_every_worker():
    whole, other = batch(0), batch(1)

    def agents(sources):
        return ([sources["token_level_rewards"], other["token_level_rewards"][:len(
            sources["index"])]], [sources["values"], other["values"][:len(sources["index"])]],
            [sources["response_mask"], other["response_mask"][:len(sources["index"])]])

    def marft(sources, reduction=LOCAL):
        rewards, values, masks = agents(sources)
        return ca.get_adv_estimator_fn("gae_marft")(rewards, values, masks, 0.9, 0.8,
                                                    reduction)

    adv_one, ret_one = marft(whole)
    other_halves = [rows(other, 0, 6), rows(other, 6, ROWS)]
    halves = [rows(whole, 0, 6), rows(whole, 6, ROWS)]

    def part_marft(part, reduction):
        sources, other_part = part
        rewards = [sources["token_level_rewards"], other_part["token_level_rewards"]]
        values = [sources["values"], other_part["values"]]
        masks = [sources["response_mask"], other_part["response_mask"]]
        return ca.get_adv_estimator_fn("gae_marft")(rewards, values, masks, 0.9, 0.8,
                                                    reduction)

    parts = on_workers(part_marft, list(zip(halves, other_halves, strict=True)))
    for agent in range(2):
        torch.testing.assert_close(torch.cat([adv[agent] for adv, _ in parts]),
                                   adv_one[agent], atol=1e-12, rtol=0)
        torch.testing.assert_close(torch.cat([ret[agent] for _, ret in parts]),
                                   ret_one[agent], atol=1e-12, rtol=0)


def test_a_peer_holding_copied_rows_adds_nothing():
    """Tensor-parallel peers hold the same rows; only the source's count."""
    whole = batch()
    want = estimate("gae", whole)[0]
    got = on_workers(lambda part, reduction: estimate("gae", part, reduction),
                     [whole, whole], contributes=[True, False])
    for adv, _ in got:
        torch.testing.assert_close(adv, want, atol=1e-12, rtol=0)


def test_masked_whiten_float32_agrees_across_splits_within_1e_6():
    g = torch.Generator().manual_seed(3)
    values = torch.randn(64, 9, generator=g) * 3 + 1
    mask = (torch.rand(64, 9, generator=g) > 0.3).float()
    one = ca.masked_whiten(values, mask)
    parts = on_workers(lambda part, reduction: ca.masked_whiten(*part, reduction=reduction),
                       [(values[:20], mask[:20]), (values[20:], mask[20:])])
    assert one.dtype == torch.float32
    torch.testing.assert_close(torch.cat(parts), one, atol=1e-6, rtol=0)


def test_a_group_split_over_two_workers_stops_the_advantage_node():
    with pytest.raises(DataError, match="uid='p1' has rows on two workers"):
        on_workers(lambda part, reduction: algorithm_nodes.check_groups_whole(part, reduction),
                   [UIDS[:4], UIDS[4:]])
    on_workers(lambda part, reduction: algorithm_nodes.check_groups_whole(part, reduction),
               [UIDS[:6], UIDS[6:]])  # whole groups: fine
    algorithm_nodes.check_groups_whole(UIDS, LOCAL)


def test_advantage_metrics_are_token_means_of_the_whole_batch():
    whole = batch()
    adv, ret = estimate("gae", whole)
    mask = whole["response_mask"]
    one = algorithm_nodes.advantage_metrics(adv, ret, mask, LOCAL)
    assert one["critic/advantages/mean"] == pytest.approx(
        float(adv[mask.bool()].mean()), abs=1e-12)
    parts = on_workers(lambda part, reduction: algorithm_nodes.advantage_metrics(
        *part, reduction), [(adv[:3], ret[:3], mask[:3]), (adv[3:], ret[3:], mask[3:])])
    for got in parts:  # unequal token counts: the mean of the two means would differ
        assert got == pytest.approx(one, abs=1e-12)
    nothing = algorithm_nodes.advantage_metrics(adv, ret, torch.zeros_like(mask), LOCAL)
    assert nothing == {}


def test_kl_controller_sees_the_whole_batch():
    class Recorder:
        value = 0.1

        def update(self, current_kl, n_steps):
            self.seen = (current_kl, n_steps)

    def update(part, reduction):
        controller = algorithm_nodes.GlobalKLController(Recorder(), reduction)
        controller.update(*part)
        return controller.inner.seen, controller.current_kl

    got = on_workers(update, [(0.5, 2), (2.0, 6)])
    for seen, current in got:
        assert seen == pytest.approx(((0.5 * 2 + 2.0 * 6) / 8, 8))
        assert current == pytest.approx(13 / 8)


@pytest.mark.parametrize("method", ["mean", "mean_std"])
def test_agentic_batch_score_normalization_spans_the_workers(method):
    from siirl.data_coordinator.protocol import make_batch
    from siirl.environment.agentic.rollout_node import normalize_scores

    def rows_of(scores):
        mask = torch.ones(len(scores), 3)
        token = torch.zeros(len(scores), 3)
        token[:, -1] = torch.tensor(scores)
        return make_batch({"token_level_scores": token, "token_level_rewards": token.clone(),
                           "response_mask": mask}, {"uid": [str(i) for i in range(len(scores))]})

    scores = [1.0, 0.0, 2.0, 5.0, -1.0]
    whole = rows_of(scores)
    normalize_scores(whole, "batch", method)

    def normalize(part, reduction):
        normalize_scores(part, "batch", method, reduction=reduction)
        return part["token_level_scores"]

    got = on_workers(normalize, [rows_of(scores[:2]), rows_of(scores[2:])])
    torch.testing.assert_close(torch.cat(got), whole["token_level_scores"], atol=1e-6, rtol=0)
