"""Policy and value losses in core_algos against float64 references written as loops."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from siirl.dag_worker import core_algos as ca
from siirl.errors import ConfigError
from siirl.params import ActorArguments, PolicyLossArguments

# Row 1 is fully padded and row 2 has a hole: padding in the middle of the batch.
MASK = torch.tensor([[1, 1, 1, 0],
                     [0, 0, 0, 0],
                     [1, 0, 1, 1],
                     [1, 1, 0, 0]], dtype=torch.float64)
CELLS = [(i, j) for i in range(4) for j in range(4) if MASK[i, j]]
ROWS = [[j for j in range(4) if MASK[i, j]] for i in range(4)]


def _rand(seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((4, 4), generator=g, dtype=torch.float64) * scale


def _inputs():
    old = _rand(0, 0.5)
    new = old + _rand(1, 0.4)
    adv = _rand(2)
    return old, new, adv


def _f(t, cell):
    return float(t[cell])


def _token_mean(values):
    return sum(values[c] for c in CELLS) / len(CELLS)


def _seq_mean_token_mean(values):
    rows = [r for r in range(4) if ROWS[r]]
    return sum(sum(values[(r, j)] for j in ROWS[r]) / len(ROWS[r]) for r in rows) / len(rows)


def _check(got, want, tol=1e-12):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert float(torch.as_tensor(g).detach()) == pytest.approx(w, abs=tol)


# ---- gspo ----------------------------------------------------------------------------

def _gspo_reference(old, new, adv, low, high, agg):
    losses, clipped, kl = {}, 0, 0.0
    for r in range(4):
        if not ROWS[r]:
            continue
        seq_lr = sum(_f(new, (r, j)) - _f(old, (r, j)) for j in ROWS[r]) / len(ROWS[r])
        ratio = math.exp(min(seq_lr, 10.0))
        for j in ROWS[r]:
            a = _f(adv, (r, j))
            l1, l2 = -a * ratio, -a * min(max(ratio, 1 - low), 1 + high)
            losses[(r, j)] = max(l1, l2)
            clipped += l2 > l1
            kl += _f(old, (r, j)) - _f(new, (r, j))
    return agg(losses), clipped / len(CELLS), kl / len(CELLS), 0.0


def test_gspo_sequence_ratio():
    old, new, adv = _inputs()
    new[0] = old[0] + 0.3  # row 0: sequence ratio exp(0.3) clipped at 1.28
    config = {"clip_ratio": 0.2, "clip_ratio_high": 0.28}
    got = ca.get_policy_loss_fn("gspo")(old, new, adv, MASK, config=config)
    want = _gspo_reference(old, new, adv, 0.2, 0.28, _seq_mean_token_mean)
    _check(got, want)
    assert want[1] > 0
    got = ca.compute_policy_loss_gspo(old, new, adv, MASK, "token-mean", config)
    _check(got, _gspo_reference(old, new, adv, 0.2, 0.28, _token_mean))


def test_gspo_gradient_flows_through_each_token_with_the_sequence_ratio():
    old = torch.zeros(1, 3, dtype=torch.float64)
    new = torch.tensor([[0.05, -0.02, 0.4]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    loss = ca.compute_policy_loss_gspo(old, new, adv, mask)[0]
    loss.backward()
    seq_ratio = math.exp((0.05 - 0.02) / 2)  # inside [0.8, 1.2]: not clipped
    assert new.grad[0].tolist() == pytest.approx([-seq_ratio / 2, -seq_ratio / 2, 0.0])


# ---- cpgd ----------------------------------------------------------------------------

def test_cpgd_clips_the_log_prob():
    old, new, adv = _inputs()
    new[0, 0], adv[0, 0] = old[0, 0] + 0.5, 1.0     # clipped above
    new[2, 0], adv[2, 0] = old[2, 0] - 0.5, -1.0    # clipped below
    new[3, 1], adv[3, 1] = old[3, 1] + 1.5, -0.5    # ratio > clip_ratio_c, A < 0
    new[0, 1] = old[0, 1]                           # ratio 1: inside the trust region
    low, high, c = 0.2, 0.28, 3.0
    losses, clipped, lower, kl = {}, 0, 0, 0.0
    for cell in CELLS:
        o, n, a = _f(old, cell), _f(new, cell), _f(adv, cell)
        ratio = math.exp(n - o)
        if a > 0:
            clp = min(n, o + math.log(1 + high))
            clipped += ratio > 1 + high
        else:
            clp = max(n, o + math.log(1 - low))
            clipped += ratio < 1 - low
        lower += ratio > c and a < 0
        losses[cell] = -clp * a
        kl += o - n
    want = (_token_mean(losses), clipped / len(CELLS), kl / len(CELLS), lower / len(CELLS))
    new.requires_grad_(True)
    got = ca.get_policy_loss_fn("cpgd")(old, new, adv, MASK, "token-mean",
                                        {"clip_ratio_low": low, "clip_ratio_high": high})
    _check(got, want)
    assert want[1] > 0 and want[3] > 0
    got[0].backward()
    assert new.grad[0, 0].item() == 0.0 and new.grad[2, 0].item() == 0.0
    assert new.grad[0, 1].item() == pytest.approx(-_f(adv, (0, 1)) / len(CELLS))


# ---- gpg -----------------------------------------------------------------------------

def test_gpg_plain_policy_gradient():
    old, new, adv = _inputs()
    losses = {cell: -_f(new, cell) * _f(adv, cell) for cell in CELLS}
    got = ca.get_policy_loss_fn("gpg")(old, new, adv, MASK, "seq-mean-token-mean")
    _check(got, (_seq_mean_token_mean(losses), 0.0, 0.0, 0.0))


# ---- clip_cov --------------------------------------------------------------------------

def _cov(adv, logp):
    mean_a = sum(_f(adv, c) for c in CELLS) / len(CELLS)
    mean_l = sum(_f(logp, c) for c in CELLS) / len(CELLS)
    return {c: (_f(adv, c) - mean_a) * (_f(logp, c) - mean_l) for c in CELLS}


def _clip_cov_parts(old, new, adv, low, high):
    vanilla, clipped_by_ratio = {}, set()
    for c in CELLS:
        ratio = math.exp(_f(new, c) - _f(old, c))
        a = _f(adv, c)
        l1, l2 = -a * ratio, -a * min(max(ratio, 1 - low), 1 + high)
        vanilla[c] = max(l1, l2)
        if l2 > l1:
            clipped_by_ratio.add(c)
    return vanilla, clipped_by_ratio


def test_clip_cov_detaches_candidates_in_the_covariance_band():
    old, new, adv = _inputs()
    cov = _cov(adv, new)
    vanilla, by_ratio = _clip_cov_parts(old, new, adv, 0.2, 0.2)
    lb, ub = 0.05, 0.6
    candidates = {c for c in CELLS if lb < cov[c] < ub and c not in by_ratio}
    assert 0 < len(candidates) <= 4  # clip_num = int(0.5 * 8) = 4 keeps them all
    config = {"clip_ratio": 0.2, "policy_loss": {"clip_cov_ratio": 0.5, "clip_cov_lb": lb,
                                                 "clip_cov_ub": ub}}
    losses = {c: 0.0 if c in candidates else vanilla[c] for c in CELLS}
    kl = sum(_f(old, c) - _f(new, c) for c in CELLS) / len(CELLS)
    want = (_token_mean(losses), len(candidates) / len(CELLS), kl, 0.0)
    new.requires_grad_(True)
    got = ca.get_policy_loss_fn("clip_cov")(old, new, adv, MASK, "token-mean", config)
    _check(got, want)
    got[0].backward()
    for c in candidates:
        assert new.grad[c].item() == 0.0


def test_clip_cov_caps_the_number_of_detached_tokens():
    old, new, adv = _inputs()
    config = {"policy_loss": {"clip_cov_ratio": 0.2, "clip_cov_lb": -100.0,
                              "clip_cov_ub": 100.0}}
    _, by_ratio = _clip_cov_parts(old, new, adv, 0.2, 0.2)
    assert len(CELLS) - len(by_ratio) > 1  # more candidates than int(0.2 * 8) = 1
    torch.manual_seed(0)
    _, clipfrac, _, _ = ca.compute_policy_loss_clip_cov(old, new, adv, MASK, config=config)
    assert clipfrac.item() == pytest.approx(1 / len(CELLS))


# ---- kl_cov --------------------------------------------------------------------------

def test_kl_cov_penalises_the_top_covariance_tokens():
    old, new, adv = _inputs()
    cov = _cov(adv, new)
    k = max(1, int(len(CELLS) * 0.3))  # 2
    top = sorted(CELLS, key=lambda c: -cov[c])[:k]
    losses = {}
    for c in CELLS:
        lr = _f(new, c) - _f(old, c)
        losses[c] = -_f(adv, c) * math.exp(lr) + (0.5 * abs(lr) if c in top else 0.0)
    abs_kl = sum(abs(_f(new, c) - _f(old, c)) for c in CELLS) / len(CELLS)
    config = {"policy_loss": {"kl_cov_ratio": 0.3, "ppo_kl_coef": 0.5}}
    got = ca.get_policy_loss_fn("kl_cov")(old, new, adv, MASK, "token-mean", config)
    _check(got, (_token_mean(losses), 0.0, abs_kl, 0.0))


# ---- geo_mean ------------------------------------------------------------------------

def test_geo_mean_sequence_geometric_ratio():
    old, new, adv = _inputs()
    new[0, 0] = old[0, 0] + 0.5  # outside [-0.2, 0.28]: clipped
    low, high = 0.2, 0.28
    seq_losses, clipped_hi, clipped_lo, kl = [], 0, 0, 0.0
    for r in range(4):
        if not ROWS[r]:
            continue
        log_terms, advs = [], []
        for j in ROWS[r]:
            lr, a = _f(new, (r, j)) - _f(old, (r, j)), _f(adv, (r, j))
            clamped = min(max(lr, -low), high)
            sign = (a > 0) - (a < 0)
            log_terms.append(sign * min(sign * lr, sign * clamped))
            advs.append(a)
            clipped_hi += clamped != lr and a > 0
            clipped_lo += clamped != lr and a < 0
            kl -= lr
        ratio = math.exp(sum(log_terms) / len(log_terms))
        seq_losses.append(-sum(advs) / len(advs) * ratio)
    want = (sum(seq_losses) / len(seq_losses), clipped_hi / len(CELLS),
            kl / len(CELLS), clipped_lo / len(CELLS))
    config = {"clip_ratio_low": low, "clip_ratio_high": high}
    got = ca.get_policy_loss_fn("geo_mean")(old, new, adv, MASK, "token-mean", config)
    _check(got, want)
    assert want[1] + want[3] > 0


# ---- config forms and registry -------------------------------------------------------

@pytest.mark.parametrize("name", ["vanilla", "gspo", "cpgd", "clip_cov", "kl_cov", "geo_mean"])
def test_config_may_be_dict_dataclass_or_dictconfig(name):
    old, new, adv = _inputs()
    as_dict = {"clip_ratio": 0.2, "clip_ratio_low": 0.15, "clip_ratio_high": 0.3,
               "clip_ratio_c": 3.0,
               "policy_loss": {"loss_mode": name, "clip_cov_ratio": 0.5, "clip_cov_lb": 0.05,
                               "clip_cov_ub": 0.6, "kl_cov_ratio": 0.3, "ppo_kl_coef": 0.5}}
    dataclass = ActorArguments(clip_ratio=0.2, clip_ratio_low=0.15, clip_ratio_high=0.3,
                               policy_loss=PolicyLossArguments(
                                   loss_mode=name, clip_cov_ratio=0.5, clip_cov_lb=0.05,
                                   clip_cov_ub=0.6, kl_cov_ratio=0.3, ppo_kl_coef=0.5))
    fn = ca.get_policy_loss_fn(name)
    want = fn(old, new, adv, MASK, "token-mean", as_dict)
    for config in (dataclass, OmegaConf.create(as_dict)):
        _check(fn(old, new, adv, MASK, "token-mean", config), [float(w) for w in want], 0)


def test_cov_ratios_must_be_positive():
    old, new, adv = _inputs()
    for name, key in (("clip_cov", "clip_cov_ratio"), ("kl_cov", "kl_cov_ratio")):
        with pytest.raises(ConfigError, match=key):
            ca.get_policy_loss_fn(name)(old, new, adv, MASK, "token-mean",
                                        {"policy_loss": {key: 0.0}})


def test_policy_loss_registry_lists_names():
    expected = {"clip_cov", "cpgd", "geo_mean", "gpg", "gspo", "kl_cov", "vanilla"}
    assert set(ca.registered_policy_losses()) == expected
    with pytest.raises(ConfigError, match="clip_cov, cpgd, geo_mean, gpg, gspo, kl_cov, vanilla"):
        ca.get_policy_loss_fn("ppo2")


# ---- value loss ----------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_value_loss_is_clipped(mode):
    values, returns = _rand(5), _rand(6)
    vpreds = values + _rand(7, 0.6)
    c = 0.3
    losses, clipped = {}, 0
    for cell in CELLS:
        v, ret, old = _f(vpreds, cell), _f(returns, cell), _f(values, cell)
        v_clip = min(max(v, old - c), old + c)
        l1, l2 = (v - ret) ** 2, (v_clip - ret) ** 2
        losses[cell] = max(l1, l2)
        clipped += l2 > l1
    if mode == "token-mean":
        agg = _token_mean(losses)
    else:
        rows = [r for r in range(4) if ROWS[r]]
        agg = sum(sum(losses[(r, j)] for j in ROWS[r]) for r in rows) / len(rows)
    got = ca.compute_value_loss(vpreds, returns, values, MASK, cliprange_value=c,
                                loss_agg_mode=mode)
    _check(got, (0.5 * agg, clipped / len(CELLS)))
    assert 0 < clipped < len(CELLS)


def test_truncated_importance_sampling_weighs_each_token():
    """verl's tis_imp_ratio_cap: each token's loss times min(exp(old - rollout), cap)."""
    torch.manual_seed(0)
    old = torch.randn(3, 5) * 0.3
    log_prob = (old + torch.randn(3, 5) * 0.05).requires_grad_()
    rollout = old + torch.randn(3, 5) * 0.5
    adv = torch.randn(3, 5)
    mask = torch.ones(3, 5)
    mask[2, 3:] = 0
    cfg = {"tis_imp_ratio_cap": 1.5}
    plain = ca.compute_policy_loss_vanilla(old, log_prob, adv, mask, "token-mean", {})[0]
    off = ca.compute_policy_loss_vanilla(old, log_prob, adv, mask, "token-mean",
                                         {"tis_imp_ratio_cap": -1}, rollout_log_probs=rollout)[0]
    assert torch.equal(plain, off)  # cap <= 0: no weighting
    got = ca.compute_policy_loss_vanilla(old, log_prob, adv, mask, "token-mean", cfg,
                                         rollout_log_probs=rollout)[0]
    weights = torch.exp(old - rollout).clamp(max=1.5)
    assert float(weights.max()) == 1.5 and float(weights.min()) < 1.0  # both sides seen
    ratio = torch.exp(log_prob - old)
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    per_token = torch.where(adv < 0, torch.minimum(-adv * 3.0, per_token), per_token)
    want = (per_token * weights * mask).sum() / mask.sum()
    assert torch.allclose(got, want, atol=1e-6)
    got.backward()
    assert log_prob.grad is not None  # the weights carry no gradient, the ratio does
    assert not ca.tis_weights(old, rollout, 1.5).requires_grad
