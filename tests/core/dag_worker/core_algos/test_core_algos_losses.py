"""Loss math in core_algos against float64 hand computations (loops over python floats)."""

import math

import pytest
import torch

from siirl.dag_worker import core_algos as ca
from siirl.errors import ConfigError

# Row 1 is fully padded and row 2 has a hole: padding in the middle of the batch.
MASK = torch.tensor([[1, 1, 1, 0],
                     [0, 0, 0, 0],
                     [1, 0, 1, 1],
                     [1, 1, 0, 0]], dtype=torch.float64)


def _rand(seed, shape=(4, 4), scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64) * scale


def _cells(mask):
    return [(i, j) for i in range(mask.shape[0]) for j in range(mask.shape[1]) if mask[i, j]]


def _rows(mat, mask):
    """Per non-empty row: (token sum, token count)."""
    out = []
    for i in range(mask.shape[0]):
        idx = [j for j in range(mask.shape[1]) if mask[i, j]]
        if idx:
            out.append((sum(float(mat[i, j]) for j in idx), len(idx)))
    return out


def test_agg_loss_modes_match_hand_computation():
    loss = _rand(0)
    cells = _cells(MASK)
    rows = _rows(loss, MASK)
    expected = {
        "token-mean": sum(float(loss[c]) for c in cells) / len(cells),
        "seq-mean-token-sum": sum(s for s, _ in rows) / len(rows),
        "seq-mean-token-mean": sum(s / n for s, n in rows) / len(rows),
        "seq-mean-token-sum-norm": sum(s for s, _ in rows) / MASK.shape[1],
    }
    assert set(ca.registered_agg_modes()) == set(expected)
    for mode, value in expected.items():
        assert ca.agg_loss(loss, MASK, mode).item() == pytest.approx(value, abs=1e-12), mode
    # a padded position's value never matters
    poisoned = loss.clone()
    poisoned[MASK == 0] = 1e6
    for mode, value in expected.items():
        assert ca.agg_loss(poisoned, MASK, mode).item() == pytest.approx(value, abs=1e-9), mode


def test_agg_loss_units():
    assert ca.agg_loss_units(MASK, "token-mean").item() == 8
    assert ca.agg_loss_units(MASK, "seq-mean-token-mean").item() == 3
    assert ca.agg_loss_units(MASK, "seq-mean-token-sum").item() == 3
    assert ca.agg_loss_units(MASK, "seq-mean-token-sum-norm") is None


def test_agg_loss_split_weighted_by_units_equals_whole():
    """Micro-batch losses weighted by units/total reproduce the whole-batch loss."""
    loss = _rand(1)
    for mode in ca.registered_agg_modes():
        total = ca.agg_loss_units(MASK, mode)
        parts = 0.0
        for rows in ([0, 1], [2, 3]):
            part = ca.agg_loss(loss[rows], MASK[rows], mode)
            units = ca.agg_loss_units(MASK[rows], mode)
            parts += part if total is None else part * units / total
        assert parts.item() == pytest.approx(ca.agg_loss(loss, MASK, mode).item(), abs=1e-12)


def test_unknown_agg_mode():
    with pytest.raises(ConfigError, match="token-mean"):
        ca.agg_loss(MASK, MASK, "bogus")


def _hand_ppo(old, new, adv, mask, low, high, c):
    cells = _cells(mask)
    losses, clipped, lower, kls = {}, 0, 0, 0.0
    for cell in cells:
        log_ratio = min(max(float(new[cell]) - float(old[cell]), -20.0), 20.0)
        ratio, a = math.exp(log_ratio), float(adv[cell])
        kls += -log_ratio
        l1, l2 = -a * ratio, -a * min(max(ratio, 1 - low), 1 + high)
        clipped += l2 > l1
        loss = max(l1, l2)
        if a < 0:
            lower += loss > -a * c
            loss = min(loss, -a * c)
        losses[cell] = loss
    n = len(cells)
    return sum(losses.values()) / n, clipped / n, kls / n, lower / n


def test_vanilla_ppo_loss_matches_hand_computation():
    old = _rand(2, scale=0.5)
    new = old + _rand(3, scale=0.6)  # wide enough to hit both clips and the dual clip
    new[0, 0] = old[0, 0] + 2.0
    adv = _rand(4)
    adv[0, 0] = -1.5
    config = {"clip_ratio": 0.2, "clip_ratio_low": 0.1, "clip_ratio_high": 0.28,
              "clip_ratio_c": 3.0}
    fn = ca.get_policy_loss_fn("vanilla")
    got = fn(old, new, adv, MASK, "token-mean", config)
    want = _hand_ppo(old, new, adv, MASK, 0.1, 0.28, 3.0)
    for g, w in zip(got, want, strict=True):
        assert g.item() == pytest.approx(w, abs=1e-12)
    assert want[3] > 0 and want[1] > 0  # the case really exercises both clips


def test_vanilla_ppo_defaults_low_high_to_clip_ratio():
    old, new, adv = _rand(5), _rand(6), _rand(7)
    got = ca.compute_policy_loss_vanilla(old, new, adv, MASK, config={"clip_ratio": 0.3})
    want = _hand_ppo(old, new, adv, MASK, 0.3, 0.3, 3.0)
    for g, w in zip(got, want, strict=True):
        assert g.item() == pytest.approx(w, abs=1e-12)


def test_vanilla_ppo_gradient_vanishes_when_clipped():
    old = torch.zeros(1, 2, dtype=torch.float64)
    new = torch.tensor([[0.5, -0.5]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    loss = ca.compute_policy_loss_vanilla(old, new, adv, torch.ones(1, 2))[0]
    loss.backward()
    assert new.grad.abs().max().item() == 0.0  # both ratios outside [0.8, 1.2] on the
    # side the advantage pushes towards


def test_policy_loss_registry():
    assert ca.get_policy_loss_fn("vanilla") is ca.compute_policy_loss_vanilla
    with pytest.raises(ConfigError, match="vanilla"):
        ca.get_policy_loss_fn("nope")
    with pytest.raises(ConfigError, match="clip_ratio_c"):
        ca.compute_policy_loss_vanilla(MASK, MASK, MASK, MASK, config={"clip_ratio_c": 1.0})


def test_kl_estimators_values():
    lp, ref = _rand(8), _rand(9)
    for i in range(4):
        for j in range(4):
            d = float(lp[i, j]) - float(ref[i, j])
            k3 = min(max(math.exp(-d) + d - 1, -10), 10)
            for names, value in ((("kl", "k1"), d), (("abs",), abs(d)),
                                 (("mse", "k2"), 0.5 * d * d), (("low_var_kl", "k3"), k3)):
                for name in names:
                    for suffix in ("", "+"):
                        got = ca.kl_penalty(lp, ref, name + suffix)[i, j].item()
                        assert got == pytest.approx(value, abs=1e-12), name + suffix


def test_low_var_kl_is_clamped():
    lp = torch.tensor([[0.0]], dtype=torch.float64)
    ref = torch.tensor([[30.0]], dtype=torch.float64)
    assert ca.kl_penalty(lp, ref, "low_var_kl").item() == 10.0


def test_straight_through_kl_has_k2_gradient():
    ref = _rand(10)
    for name in ("k1+", "k3+", "abs+", "low_var_kl+"):
        lp = _rand(11).requires_grad_(True)
        ca.kl_penalty(lp, ref, name).sum().backward()
        assert torch.allclose(lp.grad, (lp - ref).detach()), name
    lp = _rand(11).requires_grad_(True)
    ca.kl_penalty(lp, ref, "k1").sum().backward()
    assert torch.allclose(lp.grad, torch.ones_like(lp))


def test_kl_full_and_unknown():
    with pytest.raises(ConfigError, match="full-vocabulary"):
        ca.kl_penalty(MASK, MASK, "full")
    with pytest.raises(ConfigError, match="low_var_kl"):
        ca.kl_penalty(MASK, MASK, "k9")


def test_entropy_loss_from_logits_and_entropy():
    logits = _rand(12, shape=(4, 4, 5))
    ent = torch.zeros(4, 4, dtype=torch.float64)
    for i in range(4):
        for j in range(4):
            z = [float(v) for v in logits[i, j]]
            m = max(z)
            total = sum(math.exp(v - m) for v in z)
            ent[i, j] = -sum(math.exp(v - m) / total * ((v - m) - math.log(total)) for v in z)
    cells = _cells(MASK)
    want = sum(float(ent[c]) for c in cells) / len(cells)
    assert ca.compute_entropy_loss(logits, MASK, "token-mean").item() == pytest.approx(want)
    assert ca.compute_entropy_loss(ent, MASK).item() == pytest.approx(want, abs=1e-12)
    want_seq = ca.agg_loss(ent, MASK, "seq-mean-token-mean").item()
    assert ca.compute_entropy_loss(logits, MASK, "seq-mean-token-mean").item() == \
        pytest.approx(want_seq, abs=1e-12)
