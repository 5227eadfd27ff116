"""KL estimators, KL controllers and apply_kl_penalty against hand computations."""

import math
from dataclasses import asdict

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from siirl.dag_worker import core_algos as ca
from siirl.errors import ConfigError, DataError
from siirl.params.training_args import KLCtrlArguments


def _rand(seed, shape=(3, 4)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64)


# ---- estimators ----------------------------------------------------------------------

def _value_and_grad(name, d):
    """Forward value and d/dlogprob of each estimator at d = logprob - ref."""
    k3_x = min(max(-d, -20.0), 20.0)
    table = {
        "kl": (d, 1.0), "k1": (d, 1.0),
        "abs": (abs(d), math.copysign(1.0, d)),
        "mse": (0.5 * d * d, d), "k2": (0.5 * d * d, d),
        "low_var_kl": (min(max(math.exp(k3_x) - k3_x - 1, -10), 10), 1 - math.exp(-d)),
        "k3": (min(max(math.exp(k3_x) - k3_x - 1, -10), 10), 1 - math.exp(-d)),
    }
    return table[name]


@pytest.mark.parametrize("name", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_estimator_values_and_gradients(name):
    ref = _rand(0)
    logprob = (ref + _rand(1)).requires_grad_(True)
    value = ca.kl_penalty(logprob, ref, name)
    value.sum().backward()
    for i in range(3):
        for j in range(4):
            d = float(logprob[i, j].detach()) - float(ref[i, j])
            want_value, want_grad = _value_and_grad(name, d)
            assert value[i, j].item() == pytest.approx(want_value, abs=1e-12)
            assert logprob.grad[i, j].item() == pytest.approx(want_grad, abs=1e-12)


@pytest.mark.parametrize("name", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_straight_through_variant_has_own_value_and_k2_gradient(name):
    ref = _rand(2)
    logprob = (ref + _rand(3)).requires_grad_(True)
    value = ca.kl_penalty(logprob, ref, name + "+")
    value.sum().backward()
    for i in range(3):
        for j in range(4):
            d = float(logprob[i, j].detach()) - float(ref[i, j])
            assert value[i, j].item() == pytest.approx(_value_and_grad(name, d)[0], abs=1e-12)
            assert logprob.grad[i, j].item() == pytest.approx(d, abs=1e-12)  # k2's gradient


def test_k3_clamps():
    lp = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[30.0, -30.0]], dtype=torch.float64)
    # exp(20) - 20 - 1 clamps to 10; exp(-20) + 20 - 1 = 19 + tiny clamps to 10
    assert ca.kl_penalty(lp, ref, "k3").tolist() == [[10.0, 10.0]]


def test_full_and_unknown_estimators():
    x = torch.zeros(1, 1)
    with pytest.raises(ConfigError, match="full-vocabulary"):
        ca.kl_penalty(x, x, "full")
    with pytest.raises(ConfigError, match=r"abs, full, k1, k2, k3, kl, low_var_kl, mse.*'\+'"):
        ca.kl_penalty(x, x, "k4+")
    assert set(ca.registered_kl_estimators()) == {"abs", "full", "k1", "k2", "k3", "kl",
                                                  "low_var_kl", "mse"}


# ---- controllers ---------------------------------------------------------------------

def _adaptive_reference(value, target, horizon, updates):
    for current_kl, n_steps in updates:
        error = min(max(current_kl / target - 1, -0.2), 0.2)
        value *= 1 + error * n_steps / horizon
    return value


UPDATES = [(0.05, 8), (0.3, 8), (0.11, 16), (0.0, 4), (0.5, 8), (0.09, 8)]


def test_fixed_controller_never_changes():
    ctrl = ca.FixedKLController(kl_coef=0.02)
    for current_kl, n in UPDATES:
        ctrl.update(current_kl, n)
    assert ctrl.value == 0.02
    restored = ca.FixedKLController(kl_coef=0.5)
    restored.load_state_dict(ctrl.state_dict())
    assert restored.value == 0.02


def test_adaptive_controller_update_sequence():
    ctrl = ca.AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    values = []
    for current_kl, n in UPDATES:
        # a float64 tensor kl works like a float
        ctrl.update(current_kl=torch.tensor(current_kl, dtype=torch.float64), n_steps=n)
        values.append(ctrl.value)
    for k in range(len(UPDATES)):
        want = _adaptive_reference(0.1, 0.1, 100, UPDATES[:k + 1])
        assert values[k] == pytest.approx(want, rel=1e-15)
    # error clipped to +-0.2: kl 0.3 (error 2.0) moves the value by 1 + 0.2 * 8/100
    one = ca.AdaptiveKLController(init_kl_coef=1.0, target_kl=0.1, horizon=100)
    one.update(0.3, 8)
    assert one.value == pytest.approx(1.016, abs=1e-15)
    one.update(0.0, 8)
    assert one.value == pytest.approx(1.016 * 0.984, abs=1e-15)


def test_adaptive_state_dict_round_trip_continues_exactly():
    uninterrupted = ca.AdaptiveKLController(0.05, 0.1, 50)
    for current_kl, n in UPDATES:
        uninterrupted.update(current_kl, n)

    first = ca.AdaptiveKLController(0.05, 0.1, 50)
    for current_kl, n in UPDATES[:3]:
        first.update(current_kl, n)
    state = first.state_dict()
    resumed = ca.get_kl_controller({"type": "adaptive", "kl_coef": 0.05, "target_kl": 0.1,
                                    "horizon": 50})
    resumed.load_state_dict(state)
    for current_kl, n in UPDATES[3:]:
        resumed.update(current_kl, n)
    assert resumed.value == uninterrupted.value  # bit-for-bit
    assert state["type"] == "adaptive"


def test_get_kl_controller_from_each_config_form():
    args = KLCtrlArguments(type="adaptive", kl_coef=0.2, horizon=1000, target_kl=0.05)
    for cfg in (args, asdict(args), OmegaConf.structured(args)):
        ctrl = ca.get_kl_controller(cfg)
        assert isinstance(ctrl, ca.AdaptiveKLController)
        assert (ctrl.value, ctrl.target, ctrl.horizon) == (0.2, 0.05, 1000)
    fixed = ca.get_kl_controller(KLCtrlArguments())
    assert isinstance(fixed, ca.FixedKLController) and fixed.value == 0.001
    assert set(ca.registered_kl_controllers()) == {"adaptive", "fixed"}


def test_get_kl_controller_rejects_bad_config():
    with pytest.raises(ConfigError, match=r"kl_ctrl.type='pid'.*adaptive, fixed"):
        ca.get_kl_controller({"type": "pid"})
    with pytest.raises(ConfigError, match="horizon"):
        ca.get_kl_controller({"type": "adaptive", "horizon": 0})
    with pytest.raises(ConfigError, match="target_kl"):
        ca.get_kl_controller({"type": "adaptive", "target_kl": 0.0})


# ---- apply_kl_penalty ----------------------------------------------------------------

MASK = [[1, 1, 1, 0], [1, 0, 1, 1], [0, 0, 0, 0]]  # a hole, and an empty row


def _penalty_batch():
    return TensorDict({
        "token_level_scores": _rand(4),
        "old_log_probs": _rand(5),
        "ref_log_prob": _rand(6),
        "response_mask": torch.tensor(MASK, dtype=torch.long),
    }, batch_size=[3])


@pytest.mark.parametrize("name", ["kl", "low_var_kl"])
def test_apply_kl_penalty(name):
    batch = _penalty_batch()
    scores = batch["token_level_scores"].clone()
    ctrl = ca.AdaptiveKLController(init_kl_coef=0.3, target_kl=0.01, horizon=30)
    out, metrics = ca.apply_kl_penalty(batch, ctrl, kl_penalty=name)
    assert out is batch
    row_means = []
    for i in range(3):
        kls = []
        for j in range(4):
            d = float(batch["old_log_probs"][i, j]) - float(batch["ref_log_prob"][i, j])
            kld = _value_and_grad(name, d)[0] * MASK[i][j]
            kls.append(kld)
            want = float(scores[i, j]) - 0.3 * kld
            assert out["token_level_rewards"][i, j].item() == pytest.approx(want, abs=1e-12)
        n = sum(MASK[i])
        row_means.append(sum(kls) / n if n else 0.0)  # an empty row counts as 0 (verl)
    current_kl = sum(row_means) / 3
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(current_kl, abs=1e-12)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.3  # beta before the update
    assert ctrl.value == pytest.approx(_adaptive_reference(0.3, 0.01, 30, [(current_kl, 3)]),
                                       rel=1e-14)


def test_apply_kl_penalty_needs_its_inputs():
    batch = _penalty_batch()
    del batch["ref_log_prob"]
    with pytest.raises(DataError, match="ref_log_prob"):
        ca.apply_kl_penalty(batch, ca.FixedKLController(0.1))
