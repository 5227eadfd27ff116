"""Rollout correction in the actor's update (fsdp engine, tiny Llama, CPU, fp32): with no
lag between the rollout's and the old log-probs every mode trains exactly as plain PPO;
with a lag, the weights and the rejection act on the loss as verl's do."""

import pytest
import torch
from siirl_actor_testlib import (
    actor_config,
    actor_engine,
    one_torch_thread,  # noqa: F401 (autouse fixture: one torch thread per test)
    params,
    rollout_batch,
    tiny_model,
    with_advantages,
)

from siirl.errors import DataError

RC = "algorithm.rollout_correction"
MODES = {
    "token IS": [f"{RC}.rollout_is=token"],
    "sequence IS, normalised": [f"{RC}.rollout_is=sequence",
                                f"{RC}.rollout_is_batch_normalize=true"],
    "token and sequence rejection": [f"{RC}.rollout_rs='token_k1,seq_max_k3'",
                                     f"{RC}.rollout_rs_threshold='0.999_1.001,0.001'"],
    "bypass, ppo_clip": [f"{RC}.bypass_mode=true", f"{RC}.rollout_is=token"],
    "bypass, reinforce": [f"{RC}.bypass_mode=true", f"{RC}.loss_type=reinforce",
                          f"{RC}.rollout_is=sequence", f"{RC}.rollout_rs=seq_mean_k1",
                          f"{RC}.rollout_rs_threshold=1.001"],
}


def _advantaged(seed: int = 1):
    """A batch with old log-probs and a varied advantage per response token."""
    engine = actor_engine(actor_config(), module=tiny_model())
    batch = with_advantages(engine, rollout_batch(rows=4, seed=seed))
    g = torch.Generator().manual_seed(seed)
    batch.set("advantages", torch.randn(batch["response_mask"].shape, generator=g)
              * batch["response_mask"])
    return batch


def _update(overrides, batch):
    engine = actor_engine(actor_config(*overrides), module=tiny_model())
    metrics = engine.update_policy(batch.clone()).metrics
    return params(engine.module), metrics


def _assert_same_params(got, want):
    for name in want:
        assert torch.equal(got[name], want[name]), name


# Adam's first step is lr * g / (|g| + eps): gradients equal up to float32 rounding move a
# weight by the same lr = 0.01 up to a thousandth of it (a gradient near eps in size)
STEP_TOL = 1e-5


def _assert_close_params(got, want):
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=0, atol=STEP_TOL), name


@pytest.mark.parametrize("mode", list(MODES))
def test_no_lag_trains_exactly_as_plain_ppo(mode):
    batch = _advantaged()
    want, plain = _update([], batch)
    batch.set("rollout_log_probs", batch["old_log_probs"].clone())
    got, metrics = _update(MODES[mode], batch)
    _assert_same_params(got, want)
    assert metrics["actor/grad_norm"] == plain["actor/grad_norm"]
    if "reinforce" not in mode:  # REINFORCE's loss is -A log pi, its gradient PPO's
        assert metrics["actor/pg_loss"] == plain["actor/pg_loss"]
    assert metrics["rollout_corr/kl"] == pytest.approx(0.0, abs=1e-7)
    for key, ideal in (("rollout_corr/rollout_rs_masked_fraction", 0.0),
                       ("rollout_corr/rollout_is_batch_norm_factor", 1.0)):
        if key in metrics:
            assert metrics[key] == pytest.approx(ideal, abs=1e-7)


def test_token_weights_multiply_each_tokens_loss():
    """Decoupled token IS with a lag: the update is plain PPO's on the advantages times
    min(exp(old - rollout), threshold)."""
    batch = _advantaged()
    g = torch.Generator().manual_seed(3)
    lag = torch.randn(batch["old_log_probs"].shape, generator=g) * 0.5
    batch.set("rollout_log_probs", (batch["old_log_probs"] - lag) * batch["response_mask"])
    got, metrics = _update([f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=1.3"], batch)
    weights = torch.exp(batch["old_log_probs"] - batch["rollout_log_probs"]).clamp(max=1.3)
    weighted = batch.clone()
    weighted.set("advantages", batch["advantages"] * weights * batch["response_mask"])
    want, _ = _update([], weighted)
    _assert_close_params(got, want)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] > 0


def test_rejected_sequences_leave_the_loss():
    """Decoupled sequence rejection: the update is plain PPO's without the rejected rows."""
    batch = _advantaged()
    lag = torch.zeros_like(batch["old_log_probs"])
    lag[1] = 0.3  # row 1's rollout policy was far from the old one
    batch.set("rollout_log_probs", (batch["old_log_probs"] - lag) * batch["response_mask"])
    got, metrics = _update([f"{RC}.rollout_rs=seq_max_k2", f"{RC}.rollout_rs_threshold=0.01"],
                           batch)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(0.25)
    without = batch.clone()
    mask = batch["response_mask"].clone()
    mask[1] = 0.0
    without.set("response_mask", mask)
    want, _ = _update([], without)
    _assert_same_params(got, want)


def test_bypass_needs_the_rollouts_log_probs():
    batch = _advantaged()
    engine = actor_engine(actor_config(*MODES["bypass, ppo_clip"]), module=tiny_model())
    with pytest.raises(DataError, match="rollout_log_probs"):
        engine.update_policy(batch.clone())


def test_bypass_rejection_keeps_the_batchs_normalisation():
    """Bypass mode: the rollout's log-probs are the old ones, the rejected row's tokens
    add nothing to the loss but still count in its token mean (verl's global counts): plain
    PPO with those advantages zeroed."""
    batch = _advantaged()
    lag = torch.zeros_like(batch["old_log_probs"])
    lag[1] = 0.3
    batch.set("rollout_log_probs", (batch["old_log_probs"] - lag) * batch["response_mask"])
    got, metrics = _update([f"{RC}.bypass_mode=true", f"{RC}.rollout_rs=seq_max_k2",
                            f"{RC}.rollout_rs_threshold=0.01"], batch)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] > 0
    plain = batch.clone()
    plain.set("old_log_probs", batch["rollout_log_probs"].clone())
    advantages = batch["advantages"].clone()
    advantages[1] = 0.0
    plain.set("advantages", advantages)
    want, _ = _update([], plain)
    _assert_close_params(got, want)
