"""Advantage estimators in core_algos against float64 references written as plain loops."""

import math
import statistics

import numpy as np
import pytest
import torch

from siirl.dag_worker import core_algos as ca
from siirl.dag_worker.dagworker import DAGWorker
from siirl.data_coordinator.protocol import make_batch
from siirl.errors import ConfigError
from siirl.execution.dag.pipeline import Pipeline
from siirl.execution.scheduler.enums import AdvantageEstimator

# Rows of unequal length; row 2 has a hole in the middle; row 4 is empty.
MASK = [[1, 1, 1, 1],
        [1, 1, 0, 0],
        [1, 0, 1, 1],
        [1, 1, 1, 0],
        [0, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 1]]
# Non-zero rewards in several positions so that token sums matter.
REWARDS = [[0.0, 0.0, 0.0, 1.0],
           [0.0, 0.5, 0.0, 0.0],
           [0.2, 0.0, 0.0, -0.7],
           [0.0, 0.0, 2.0, 0.0],
           [0.0, 0.0, 0.0, 0.0],
           [0.0, 3.0, 0.0, 0.0],
           [0.1, 0.0, 0.3, 0.4]]
UIDS = ["a", "a", "a", "b", "b", "solo", "b"]


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def _scores():
    return [math.fsum(row) for row in REWARDS]


def _groups(uids=UIDS):
    groups = {}
    for i, uid in enumerate(uids):
        groups.setdefault(uid, []).append(i)
    return groups


def _stats(rows, scores):
    """verl's group statistics: a singleton has mean 0 and std 1."""
    if len(rows) == 1:
        return 0.0, 1.0
    values = [scores[i] for i in rows]
    return statistics.fmean(values), statistics.stdev(values)


def _rows_in_batch():
    """B of the batch-wide estimators: rows with at least one response token (row 4, empty,
    trains nothing and is not counted)."""
    return sum(1 for row in MASK if any(row))


def _broadcast(per_row):
    return _t([[per_row[i] * m for m in MASK[i]] for i in range(len(MASK))])


def _whiten(mat):
    """verl's masked_whiten over MASK, then zero at masked positions."""
    cells = [(i, j) for i in range(len(MASK)) for j in range(4) if MASK[i][j]]
    values = [mat[i][j] for i, j in cells]
    mean = statistics.fmean(values)
    var = statistics.variance(values)
    out = [[0.0] * 4 for _ in MASK]
    for i, j in cells:
        out[i][j] = (mat[i][j] - mean) / math.sqrt(var + 1e-8)
    return _t(out)


def _close(got, want, tol=1e-10):
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=0)


def _run(name, **kwargs):
    fn = ca.get_adv_estimator_fn(name)
    return fn(token_level_rewards=_t(REWARDS), response_mask=_t(MASK), **kwargs)


# ---- group estimators ------------------------------------------------------------------

@pytest.mark.parametrize("norm", [True, False])
def test_grpo(norm):
    scores, adv = _scores(), {}
    for rows in _groups().values():
        mean, std = _stats(rows, scores)
        for i in rows:
            adv[i] = (scores[i] - mean) / (std + 1e-6) if norm else scores[i] - mean
    want = _broadcast(adv)
    advantages, returns = _run("grpo", index=UIDS, norm_adv_by_std_in_grpo=norm)
    _close(advantages, want)
    _close(returns, want)
    # the singleton keeps its score (divided by 1 + eps when normalising)
    expected_solo = 3.0 / (1 + 1e-6) if norm else 3.0
    assert advantages[5, 0].item() == pytest.approx(expected_solo, abs=1e-12)


def test_gspo_and_drgrpo_share_grpo_advantages():
    grpo = _run("grpo", index=UIDS)[0]
    _close(_run("gspo", index=UIDS)[0], grpo, tol=0)
    assert ca.get_adv_estimator_fn(AdvantageEstimator.GSPO) is ca.compute_grpo_outcome_advantage
    _close(_run("drgrpo", index=UIDS)[0],
           _run("grpo", index=UIDS, norm_adv_by_std_in_grpo=False)[0], tol=0)


@pytest.mark.parametrize("index", [np.array(UIDS, dtype=object),
                                   torch.tensor([0, 0, 0, 1, 1, 2, 1])])
def test_index_may_be_numpy_or_tensor(index):
    # tensor items hash by identity: they must be turned into values before grouping
    _close(_run("grpo", index=index)[0], _run("grpo", index=UIDS)[0], tol=0)


def _cpgd_reference(weight):
    scores, adv = _scores(), {}
    groups = _groups()
    stats = {uid: _stats(rows, scores) for uid, rows in groups.items()}
    spread = sum(1 for _, std in stats.values() if std != 0)
    for uid, rows in groups.items():
        mean, std = stats[uid]
        for i in rows:
            centred = scores[i] - mean
            if weight == "STD_weight":
                adv[i] = centred / (std + 1e-6)
            elif weight == "clip_filter_like_weight":  # B: rows with a response token
                adv[i] = centred * min(_rows_in_batch() / spread, 3.0)
            else:
                adv[i] = centred
    return _broadcast(adv)


@pytest.mark.parametrize("weight", ["STD_weight", "clip_filter_like_weight", "naive"])
def test_cpgd(weight):
    got = _run("cpgd", index=UIDS, weight_factor_in_cpgd=weight)[0]
    _close(got, _cpgd_reference(weight))
    assert ca.get_adv_estimator_fn(AdvantageEstimator.CPGD) is ca.compute_cpgd_outcome_advantage


def test_cpgd_clip_filter_weight_counts_groups_with_spread():
    # groups: x has spread, y has equal scores (std 0), z is a singleton (std 1):
    # 2 spread groups over 5 rows -> weight min(5/2, 3) = 2.5
    rewards = torch.tensor([[1.0], [0.0], [1.0], [1.0], [4.0]], dtype=torch.float64)
    adv = ca.compute_cpgd_outcome_advantage(rewards, torch.ones(5, 1), ["x", "x", "y", "y", "z"],
                                            weight_factor_in_cpgd="clip_filter_like_weight")[0]
    assert adv[:, 0].tolist() == pytest.approx([1.25, -1.25, 0.0, 0.0, 10.0], abs=1e-12)
    # only equal-score groups: B / 0 is clamped to 3, and every advantage is 0
    adv = ca.compute_cpgd_outcome_advantage(rewards[2:4], torch.ones(2, 1), ["y", "y"],
                                            weight_factor_in_cpgd="clip_filter_like_weight")[0]
    assert adv.abs().max().item() == 0.0


def test_cpgd_unknown_weight_lists_choices():
    with pytest.raises(ConfigError, match="clip_filter_like_weight, naive"):
        _run("cpgd", index=UIDS, weight_factor_in_cpgd="bogus")


def test_rloo_is_score_minus_mean_of_others():
    scores, adv = _scores(), {}
    for rows in _groups().values():
        for i in rows:
            others = [scores[j] for j in rows if j != i]
            adv[i] = scores[i] - statistics.fmean(others) if others else scores[i]
    advantages, returns = _run("rloo", index=UIDS)
    _close(advantages, _broadcast(adv))
    _close(returns, advantages, tol=0)
    assert advantages[5, 0].item() == 3.0  # a group of one keeps its raw score


def test_reinforce_plus_plus_baseline_whitens_over_tokens():
    scores, centred = _scores(), {}
    for rows in _groups().values():
        mean, _ = _stats(rows, scores)
        for i in rows:
            centred[i] = scores[i] - mean
    tiled = [[centred[i] * m for m in MASK[i]] for i in range(len(MASK))]
    advantages, returns = _run("reinforce_plus_plus_baseline", index=UIDS)
    _close(advantages, _whiten(tiled))
    _close(returns, advantages, tol=0)


def test_opo_length_weighted_baseline():
    scores, adv = _scores(), {}
    for rows in _groups().values():
        if len(rows) == 1:
            baseline = 0.0
        else:
            lengths = [sum(MASK[i]) for i in rows]
            baseline = math.fsum(n * scores[i] for n, i in zip(lengths, rows, strict=True))
            baseline /= sum(lengths)
        for i in rows:
            adv[i] = scores[i] - baseline
    _close(_run("opo", index=UIDS)[0], _broadcast(adv))


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk_rewards_only_the_best(norm):
    uids = ["a", "a", "a", "b", "b", "b", "b"]  # no singleton: pass@k needs pairs
    scores, adv = _scores(), dict.fromkeys(range(7), 0.0)
    for rows in _groups(uids).values():
        ranked = sorted(rows, key=lambda i: -scores[i])
        value = scores[ranked[0]] - scores[ranked[1]]
        if norm:
            value /= statistics.stdev([scores[i] for i in rows]) + 1e-6
        adv[ranked[0]] = value
    _close(_run("grpo_passk", index=uids, norm_adv_by_std_in_grpo=norm)[0], _broadcast(adv))
    with pytest.raises(ConfigError, match="at least 2"):
        _run("grpo_passk", index=UIDS)


def test_gpg_scales_by_share_of_nonzero_scores():
    scores, adv = _scores(), {}
    nonzero = sum(1 for s, row in zip(scores, MASK, strict=True) if s != 0 and any(row))
    alpha = _rows_in_batch() / nonzero
    for rows in _groups().values():
        mean, _ = _stats(rows, scores)
        for i in rows:
            adv[i] = alpha * (scores[i] - mean) / 2.0
    _close(_run("gpg", index=UIDS, f_norm=2.0)[0], _broadcast(adv))


# ---- token-level estimators --------------------------------------------------------------

VALUES = [[0.3, -0.2, 0.5, 0.1],
          [1.0, 0.4, 9.0, 9.0],
          [0.0, 7.0, -0.5, 0.25],
          [0.2, 0.2, 0.2, 5.0],
          [3.0, 3.0, 3.0, 3.0],
          [-1.0, 0.5, 9.0, 9.0],
          [0.6, 0.1, -0.3, 0.8]]


def _gae_reference(gamma, lam):
    """Right to left; a masked position neither adds a TD error nor resets anything."""
    adv = []
    for rewards, values, mask in zip(REWARDS, VALUES, MASK, strict=True):
        next_value, running, row = 0.0, 0.0, [0.0] * 4
        for t in reversed(range(4)):
            if mask[t]:
                delta = rewards[t] + gamma * next_value - values[t]
                running = delta + gamma * lam * running
                next_value = values[t]
            row[t] = running
        adv.append(row)
    returns = [[a + v for a, v in zip(ra, rv, strict=True)]
               for ra, rv in zip(adv, VALUES, strict=True)]
    return _whiten(adv), _t(returns)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.8)])
def test_gae(gamma, lam):
    advantages, returns = ca.compute_gae_advantage_return(_t(REWARDS), _t(VALUES), _t(MASK),
                                                          gamma=gamma, lam=lam)
    want_adv, want_ret = _gae_reference(gamma, lam)
    _close(advantages, want_adv)
    _close(returns, want_ret)


def test_gae_hole_bootstraps_across_it():
    # row 2 (mask 1 0 1 1), gamma = lam = 1: A_0 = r_0 + V_2 - V_0 + A_2 (token 1 skipped)
    advantages, returns = ca.compute_gae_advantage_return(_t(REWARDS), _t(VALUES), _t(MASK),
                                                          gamma=1.0, lam=1.0)
    raw = returns - _t(VALUES)
    a3 = REWARDS[2][3] - VALUES[2][3]
    a2 = REWARDS[2][2] + VALUES[2][3] - VALUES[2][2] + a3
    a0 = REWARDS[2][0] + VALUES[2][2] - VALUES[2][0] + a2
    assert raw[2].tolist() == pytest.approx([a0, a2, a2, a3], abs=1e-12)
    assert advantages[2, 1].item() == 0.0 and advantages[4].abs().max().item() == 0.0


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus(gamma):
    returns = []
    for rewards, mask in zip(REWARDS, MASK, strict=True):
        running, row = 0.0, [0.0] * 4
        for t in reversed(range(4)):
            running = rewards[t] + gamma * running
            row[t] = running
            running = running if mask[t] else 0.0  # reset across masked positions
        returns.append(row)
    advantages, got_returns = _run("reinforce_plus_plus", gamma=gamma)
    _close(got_returns, _t(returns))
    _close(advantages, _whiten(returns))


# ---- registry and dispatch ------------------------------------------------------------

EXPECTED = {"cpgd", "drgrpo", "gae", "gpg", "grpo", "grpo_passk", "gspo", "opo",
            "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo", "gae_marft", "remax"}


def test_registered_names_and_unknown_name():
    assert set(ca.registered_adv_estimators()) == EXPECTED
    for member in AdvantageEstimator:
        assert member.value in EXPECTED
    with pytest.raises(ConfigError, match=r"adv_estimator='nope'.*cpgd, drgrpo, gae"):
        ca.get_adv_estimator_fn("nope")


def test_register_custom_estimator():
    from siirl.dag_worker.core_algos.advantages import _ADV_ESTIMATORS

    @ca.register_adv_est("test_only_zero")
    def zero(token_level_rewards, response_mask):
        return response_mask * 0, response_mask * 0

    try:
        assert ca.get_adv_estimator_fn("test_only_zero") is zero
    finally:  # the registry is global: leave it as the other tests expect
        _ADV_ESTIMATORS._entries.pop("test_only_zero")


@pytest.mark.parametrize("name", ["rloo", "drgrpo", "reinforce_plus_plus", "cpgd"])
def test_dag_worker_dispatches_by_name(name):
    graph = Pipeline("adv").add_node("adv", node_type="COMPUTE", node_role="ADVANTAGE").build()
    worker = DAGWorker(graph, config={"algorithm": {"adv_estimator": name}})
    batch = make_batch({"token_level_rewards": _t(REWARDS), "response_mask": _t(MASK)},
                       {"uid": list(UIDS)})
    out = worker.compute_advantage(batch).batch
    kwargs = {} if name == "reinforce_plus_plus" else {"index": UIDS}
    _close(out["advantages"], _run(name, **kwargs)[0], tol=0)
