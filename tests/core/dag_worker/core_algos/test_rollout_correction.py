"""Rollout correction (verl's ``algorithm.rollout_correction``) against a float64 reference
of verl's formulas written here as loops over tokens and rows (verl's
``rollout_corr_helper``: truncated IS weights, rejection criteria k1/k2/k3 at token and
sequence level, the off-policy metrics), and its parsing of the keys."""

import itertools
import math

import pytest
import torch

from siirl.dag_worker.core_algos.rollout_correction import (
    correct_rollout,
    is_weights,
    reinforce_loss,
    rejection_mask,
)
from siirl.params.rollout_correction import (
    RS_OPTIONS,
    RolloutCorrectionArguments,
    rollout_correction_problems,
    rs_options,
    rs_thresholds,
)

TOL = 1e-6
# row 1 has no response token, row 3 a hole in the middle
MASK = torch.tensor([[1, 1, 1, 1, 0],
                     [0, 0, 0, 0, 0],
                     [1, 1, 0, 0, 0],
                     [1, 0, 1, 1, 1],
                     [1, 1, 1, 1, 1],
                     [1, 0, 0, 0, 0]], dtype=torch.float64)
ROWS, WIDTH = MASK.shape
TOKENS = [[j for j in range(WIDTH) if MASK[i, j]] for i in range(ROWS)]


def _log_probs(seed: int, gap: float):
    g = torch.Generator().manual_seed(seed)
    train = -torch.rand((ROWS, WIDTH), generator=g, dtype=torch.float64) * 3 - 0.05
    rollout = train - torch.randn((ROWS, WIDTH), generator=g, dtype=torch.float64) * gap
    return train, rollout


def _clamp(x: float) -> float:
    return min(max(x, -20.0), 20.0)


# ---- verl's formulas, one token at a time ----------------------------------------------

def ref_weights(lr, level, threshold, normalize):
    w = torch.zeros_like(lr)
    for i, toks in enumerate(TOKENS):
        total = sum(lr[i, j].item() for j in toks)
        for j in toks:
            raw = math.exp(_clamp(lr[i, j].item() if level == "token" else total))
            w[i, j] = min(raw, threshold)
    if normalize:
        if level == "token":
            mean = sum(w[i, j].item() for i, t in enumerate(TOKENS) for j in t) / \
                sum(len(t) for t in TOKENS)
        else:
            rows = [i for i, t in enumerate(TOKENS) if t]
            mean = sum(w[i, TOKENS[i][0]].item() for i in rows) / len(rows)
        w = w / mean
    return w


def ref_token_value(x: float, kind: str) -> float:
    c = _clamp(x)
    return {"k1": -c, "k2": 0.5 * c * c, "k3": math.exp(c) - 1.0 - c}[kind]


def ref_row_values(lr, option):
    """(value tested at each valid token {(i, j): v}, value per non-empty row or None)."""
    kind = option[-2:]
    tok = {(i, j): ref_token_value(lr[i, j].item(), kind)
           for i, t in enumerate(TOKENS) for j in t}
    if option.startswith("token_"):
        return tok, None
    rows = {}
    for i, t in enumerate(TOKENS):
        values = [tok[i, j] for j in t]
        if option.startswith("seq_sum"):
            rows[i] = sum(values)
        elif option.startswith("seq_mean"):
            rows[i] = sum(values) / max(len(values), 1)
        else:
            rows[i] = max(values) if values else 0.0
    return {(i, j): rows[i] for (i, j) in tok}, rows


def ref_keep(lr, option, lower, upper):
    tested, _ = ref_row_values(lr, option)
    keep = torch.ones_like(lr)
    for (i, j), v in tested.items():
        ok = math.log(lower) <= v <= math.log(upper) if option.endswith("k1") else v <= upper
        if not ok:
            keep[i, j] = 0.0
    return keep


def ref_offpolicy(train, rollout):
    def row_mean(x, i):
        return sum(x[i, j].item() for j in TOKENS[i]) / max(len(TOKENS[i]), 1)

    tokens = [(i, j) for i, t in enumerate(TOKENS) for j in t]
    lr = {(i, j): train[i, j].item() - rollout[i, j].item() for i, j in tokens}
    diff = [row_mean(rollout, i) - row_mean(train, i) for i in range(ROWS)]
    seq = [_clamp(sum(lr[i, j] for j in TOKENS[i])) for i in range(ROWS)]
    return {
        "kl": -sum(lr.values()) / len(tokens),
        "k3_kl": sum(math.exp(v) - v - 1 for v in lr.values()) / len(tokens),
        "training_ppl": sum(math.exp(-row_mean(train, i)) for i in range(ROWS)) / ROWS,
        "rollout_ppl": sum(math.exp(-row_mean(rollout, i)) for i in range(ROWS)) / ROWS,
        "log_ppl_diff": sum(diff) / ROWS,
        "log_ppl_abs_diff": sum(abs(d) for d in diff) / ROWS,
        "ppl_ratio": sum(math.exp(d) for d in diff) / ROWS,
        "chi2_token": sum(math.exp(2 * _clamp(v)) for v in lr.values()) / len(tokens) - 1,
        "chi2_seq": sum(math.exp(2 * s) for s in seq) / ROWS - 1,
    }


# ---- the tests --------------------------------------------------------------------------

@pytest.mark.parametrize("level,normalize", list(itertools.product(("token", "sequence"),
                                                                   (False, True))))
@pytest.mark.parametrize("seed", [0, 1])
def test_importance_weights_match_verl(level, normalize, seed):
    train, rollout = _log_probs(seed, gap=0.6)
    lr = train - rollout
    weights, metrics = is_weights(lr, MASK, level, 1.5, normalize)
    assert torch.allclose(weights, ref_weights(lr, level, 1.5, normalize), atol=TOL, rtol=0)
    raw = ref_weights(lr, level, float("inf"), False)  # before truncation
    valid = [(i, j) for i, t in enumerate(TOKENS) for j in t]
    assert metrics["rollout_is_mean"] == pytest.approx(
        sum(raw[c].item() for c in valid) / len(valid), abs=TOL)
    if level == "token":
        assert metrics["rollout_is_max"] == pytest.approx(max(raw[c].item() for c in valid),
                                                          abs=TOL)
        assert metrics["rollout_is_ratio_fraction_high"] == pytest.approx(
            sum(raw[c].item() > 1.5 for c in valid) / len(valid), abs=TOL)
    else:  # verl: over all rows, an empty row's log-ratio sum being 0
        sums = [sum(lr[i, j].item() for j in t) for i, t in enumerate(TOKENS)]
        assert metrics["rollout_is_max"] == pytest.approx(math.exp(max(sums)), abs=TOL)
        assert metrics["rollout_is_ratio_fraction_high"] == pytest.approx(
            sum(s > math.log(1.5) for s in sums) / ROWS, abs=TOL)
    clamped = {c: min(max(raw[c].item(), 1 / 1.5), 1.5) for c in valid}
    mean = sum(clamped.values()) / len(valid)
    ess = 1.0 / (sum((v / mean) ** 2 for v in clamped.values()) / len(valid))
    assert metrics["rollout_is_eff_sample_size"] == pytest.approx(ess, abs=1e-5)
    assert ("rollout_is_batch_norm_factor" in metrics) == normalize


@pytest.mark.parametrize("option", RS_OPTIONS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rejection_masks_match_verl(option, seed):
    train, rollout = _log_probs(seed, gap=0.5)
    lr = train - rollout
    # bounds that keep some and reject some of these log-ratios
    spec = "0.6_1.4" if option.endswith("k1") else ("0.08" if option.startswith("token") or
                                                     "max" in option or "mean" in option
                                                     else "0.3")
    lower, upper = rs_thresholds([option], spec)[option]
    kept, metrics = rejection_mask(lr, MASK, option, spec)
    keep = ref_keep(lr, option, lower or 1.0, upper)
    assert torch.equal(kept, MASK * keep)
    valid = [(i, j) for i, t in enumerate(TOKENS) for j in t]
    rejected = sum(1 - keep[c].item() for c in valid)
    assert 0 < rejected < len(valid)  # the bounds cut through these log-ratios
    assert metrics["rollout_rs_masked_fraction"] == pytest.approx(rejected / len(valid), abs=TOL)
    rows_hit = sum(any(keep[i, j] == 0 for j in t) for i, t in enumerate(TOKENS))
    assert metrics["rollout_rs_seq_masked_fraction"] == pytest.approx(rows_hit / ROWS, abs=TOL)
    tested, rows = ref_row_values(lr, option)
    assert metrics[f"rollout_rs_{option}_mean"] == pytest.approx(
        sum(tested.values()) / len(tested), abs=TOL)
    extremes = list(rows[i] for i, t in enumerate(TOKENS) if t) if rows else \
        list(tested.values())
    assert metrics[f"rollout_rs_{option}_max"] == pytest.approx(max(extremes), abs=TOL)
    assert metrics[f"rollout_rs_{option}_min"] == pytest.approx(min(extremes), abs=TOL)


def test_several_criteria_must_all_pass():
    train, rollout = _log_probs(3, gap=0.5)
    lr = train - rollout
    kept, metrics = rejection_mask(lr, MASK, "token_k1, seq_max_k2,token_k1", "0.5_2.0,0.2")
    want = MASK * ref_keep(lr, "token_k1", 0.5, 2.0) * ref_keep(lr, "seq_max_k2", None, 0.2)
    assert torch.equal(kept, want)
    assert "rollout_rs_seq_max_k2_seq_masked_fraction" in metrics


@pytest.mark.parametrize("seed", [0, 4])
def test_offpolicy_metrics_match_verl(seed):
    train, rollout = _log_probs(seed, gap=0.3)
    cfg = RolloutCorrectionArguments(rollout_is="token")
    got = correct_rollout(train, rollout, MASK, cfg).metrics
    for key, want in ref_offpolicy(train, rollout).items():
        assert got[f"rollout_corr/{key}"] == pytest.approx(want, abs=TOL), key


def _lag_zero_configs():
    for level, normalize in itertools.product(("token", "sequence"), (False, True)):
        yield RolloutCorrectionArguments(rollout_is=level, rollout_is_batch_normalize=normalize)
    for option in RS_OPTIONS:  # verl's preset bounds: a hair around no gap
        spec = "0.999_1.001" if option.endswith("k1") else "0.001"
        yield RolloutCorrectionArguments(rollout_rs=option, rollout_rs_threshold=spec)
    for loss_type in ("ppo_clip", "reinforce"):
        yield RolloutCorrectionArguments(rollout_is="sequence", rollout_rs="seq_mean_k3",
                                         rollout_rs_threshold=0.001, bypass_mode=True,
                                         loss_type=loss_type)


@pytest.mark.parametrize("cfg", list(_lag_zero_configs()), ids=str)
def test_no_lag_means_unit_weights_and_no_rejection(cfg):
    train, _ = _log_probs(5, gap=0.0)
    fix = correct_rollout(train, train.clone(), MASK, cfg)
    assert torch.equal(fix.mask, MASK)
    if fix.weights is not None:
        assert torch.equal(fix.weights, MASK)
    assert fix.metrics["rollout_corr/kl"] == 0.0
    assert fix.metrics["rollout_corr/chi2_token"] == 0.0


def test_reinforce_loss_is_weighted_policy_gradient():
    train, rollout = _log_probs(6, gap=0.3)
    log_prob = train.clone().requires_grad_(True)
    adv = torch.randn(ROWS, WIDTH, dtype=torch.float64, generator=torch.Generator()
                      .manual_seed(7))
    weights = ref_weights(train - rollout, "token", 2.0, False)
    loss, clipfrac, ppo_kl, _ = reinforce_loss(rollout, log_prob, adv, MASK, "token-mean",
                                               weights)
    valid = [(i, j) for i, t in enumerate(TOKENS) for j in t]
    want = -sum(adv[c].item() * train[c].item() * weights[c].item() for c in valid) / len(valid)
    assert loss.item() == pytest.approx(want, abs=TOL)
    assert ppo_kl.item() == pytest.approx(
        sum(rollout[c].item() - train[c].item() for c in valid) / len(valid), abs=TOL)
    loss.backward()
    assert torch.allclose(log_prob.grad, -adv * weights * MASK / len(valid), atol=TOL)
    assert clipfrac.item() == 0.0


def test_threshold_parsing_follows_verl():
    assert rs_options("seq_sum_k1, token_k2,seq_sum_k1") == ["seq_sum_k1", "token_k2"]
    assert rs_thresholds(["token_k1"], 2.0) == {"token_k1": (0.5, 2.0)}
    assert rs_thresholds(["token_k1", "seq_max_k3"], "0.8_1.5, 0.2") == {
        "token_k1": (0.8, 1.5), "seq_max_k3": (None, 0.2)}
    assert rs_thresholds(["token_k2", "seq_mean_k3"], 0.1) == {
        "token_k2": (None, 0.1), "seq_mean_k3": (None, 0.1)}
    for options, spec, words in ((["token_k2"], "0.1_0.2", "without '_'"),
                                 (["token_k1"], "0_1.2", "positive"),
                                 (["token_k1", "token_k2", "token_k3"], "1.1,0.2", "3 rollout_rs"),
                                 (["token_k1"], None, "needs rollout_rs_threshold"),
                                 (["token_k3"], "abc", "not a number")):
        with pytest.raises(ValueError, match=words):
            rs_thresholds(options, spec)
    with pytest.raises(ValueError, match="unknown rollout_rs criterion 'seq_max_k1'"):
        rs_options("seq_max_k1")


def test_config_problems_name_the_keys():
    ok = RolloutCorrectionArguments(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")
    assert rollout_correction_problems(ok) == []
    bad = RolloutCorrectionArguments(rollout_rs="token_k2")
    (problem,) = rollout_correction_problems(bad)
    assert "algorithm.rollout_correction.rollout_rs_threshold" in problem
    assert not RolloutCorrectionArguments().corrects
    assert RolloutCorrectionArguments(rollout_is="token").decoupled
    assert not RolloutCorrectionArguments(rollout_is="token", bypass_mode=True).decoupled
