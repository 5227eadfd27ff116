"""fp16 mixed precision of the megatron engine on CPU (``<role>.megatron.dtype=float16``):
fp16 weights and compute, fp32 main weights, and megatron's dynamic loss scaling (the loss
times the scale before every backward; the optimizer unscales, skips a step whose
gradients overflow and backs the scale off after ``hysteresis`` of them).

* The fp16 GPTModel's log-probs are the fp32 model's within fp16 rounding.
* The actor (megatron's DDP + distributed optimizer) trains an update like fp32 within
  fp16 rounding, with the loss scaled (by 2**8 here); at a scale the fp16 gradients cannot
  hold the steps are skipped, the weights stay, and the scale halves after two of them.
* PPO with actor, reference and critic (torch AdamW in megatron's fp16 optimizer) in fp16
  resumes from a checkpoint bit for bit (the loss scale is in it).
* A mixture-of-experts actor at EP 2 (megatron's dense and expert optimizers) unscales both
  by one loss scale that moves once per step, and trains like fp32 within fp16 rounding.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from siirl_numerics import assert_close, rounding, scale_of
from siirl_rollout_rows import rollout_rows
from siirl_spawn import finish_rank, join_spawned, start_gloo_rank
from siirl_suites import megatron_full

pytest.importorskip("megatron.core")

from test_megatron_bf16 import _model, bf16_roundings  # noqa: E402
from test_megatron_bridge import (  # noqa: E402
    free_port,
    gloo_world_of_one,  # noqa: F401  (fixture)
    left_padded_batch,
    tiny_hf_model,
)

ACTOR = "actor_rollout_ref.actor"


def test_fp16_logprobs_match_fp32_within_fp16_rounding(gloo_world_of_one):  # noqa: F811
    from siirl.engine.megatron.heads import megatron_logprobs

    hf = tiny_hf_model("qwen2")
    input_ids, attention_mask, position_ids = left_padded_batch(hf.config.vocab_size)
    with torch.no_grad():
        want, _ = megatron_logprobs(_model(hf, torch.float32).eval(), input_ids,
                                    attention_mask, position_ids, 6)
        fp16 = _model(hf, torch.float16).eval()
        assert {p.dtype for p in fp16.parameters()} == {torch.float16}
        got, _ = megatron_logprobs(fp16, input_ids, attention_mask, position_ids, 6)
    assert not torch.equal(got, want)  # the forward really ran in fp16
    # as many roundings as bf16's, each to fp16's unit (2**-11, bf16's 2**-8)
    tol = rounding(torch.float16, bf16_roundings(hf.config), scale_of(want), want.numel())
    assert_close(got, want, tol, "fp16 vs fp32 log-probs")


def _actor(dtype: str, *extra: str):
    from siirl.engine.megatron.engines import megatron_actor
    from siirl.params.parser import parse_config

    return megatron_actor(parse_config([
        "trainer.device=cpu", f"{ACTOR}.strategy=megatron", "actor_rollout_ref.rollout.n=1",
        f"{ACTOR}.ppo_mini_batch_size=4", f"{ACTOR}.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        f"{ACTOR}.use_kl_loss=false", f"{ACTOR}.optim.lr=0.01",
        f"{ACTOR}.megatron.dtype={dtype}", *extra]))


def _weights(actor):
    return {name: p.detach().float().clone()
            for name, p in actor.backend.schedule_model.named_parameters()}


def test_the_fp16_actor_scales_the_loss_and_trains_like_fp32():
    fp32, fp16 = _actor("float32"), _actor("float16")
    scaler = fp16.backend.optimizer.megatron.chained_optimizers[0].grad_scaler
    assert float(scaler.scale) == 2.0**16  # the default start (torch's GradScaler's)
    # the built-in model's gradients are O(1) (a 200k-parameter model at lr 1e-2): 2**16
    # times them overflows fp16 (the next test); 2**8 holds them and still scales
    scaler._scale = torch.tensor([2.0**8])
    want = fp32.update_policy(fp32.compute_log_prob(rollout_rows(vocab=20)).batch).metrics
    before = _weights(fp16)
    got = fp16.update_policy(fp16.compute_log_prob(rollout_rows(vocab=20)).batch).metrics
    assert got["actor/skipped_steps"] == 0.0
    assert any(not torch.equal(before[k], v) for k, v in _weights(fp16).items())
    # the gradient norm is the unscaled one: fp32's within fp16 rounding of its terms
    # (a forward and a backward through the model: twice the forward's roundings)
    config = fp32.module.config
    for key in ("actor/pg_loss", "actor/grad_norm"):
        tol = rounding(torch.float16, bf16_roundings(config, backward=True), abs(want[key]))
        assert abs(got[key] - want[key]) <= tol.atol + tol.rtol * abs(want[key]), \
            (key, got[key], want[key])


def test_overflowing_steps_are_skipped_and_the_scale_backs_off():
    actor = _actor("float16")
    scaler = actor.backend.optimizer.megatron.chained_optimizers[0].grad_scaler
    scaler._scale = torch.tensor([2.0**40])  # scaled fp16 gradients overflow
    before = _weights(actor)
    for steps, scale in ((1, 2.0**40), (2, 2.0**39)):  # hysteresis 2: the second backs off
        batch = actor.compute_log_prob(rollout_rows(vocab=20)).batch
        metrics = actor.update_policy(batch).metrics
        assert metrics["actor/skipped_steps"] == 1.0, steps
        assert float(scaler.scale) == scale, steps
    assert all(torch.equal(before[k], v) for k, v in _weights(actor).items())


FP16_ROLES = [f"{ACTOR}.megatron.dtype=float16", "actor_rollout_ref.ref.megatron.dtype=float16",
              "critic.megatron.dtype=float16",
              # verl's key for megatron's OptimizerConfig: a start the tiny model's O(1)
              # gradients fit in (2**16 would skip the first steps, backing off)
              f"+{ACTOR}.optim.override_optimizer_config.initial_loss_scale=256",
              "+critic.optim.override_optimizer_config.initial_loss_scale=256"]
PPO_FP16 = [f"{ACTOR}.strategy=megatron", "actor_rollout_ref.ref.strategy=megatron",
            "critic.strategy=megatron", "algorithm.adv_estimator=gae",
            f"{ACTOR}.use_kl_loss=true", *FP16_ROLES]


@megatron_full  # the bf16 resume runs in CI (test_megatron_bf16), fp16 trains in CI below
def test_fp16_ppo_resumes_bitwise(tmp_path):
    """Steps 3 and 4 after a resume from step 2's checkpoint (fp16 weights, fp32 main
    weights, Adam state and the loss scale of the actor's distributed optimizer and the
    critic's fp16 AdamW) equal the uninterrupted run's exactly."""
    from test_megatron_bf16 import RESUMED_KEYS
    from test_megatron_engine import steps, train

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train(whole, *PPO_FP16, "trainer.total_training_steps=4", "trainer.save_freq=-1")
    train(parts, *PPO_FP16, "trainer.total_training_steps=2", "trainer.save_freq=2")
    train(parts, *PPO_FP16, "trainer.total_training_steps=4", "trainer.save_freq=-1")
    want, got = steps(whole), steps(parts)
    for step in (1, 2, 3, 4):
        assert want[step]["actor/skipped_steps"] == 0.0 == want[step]["critic/skipped_steps"]
    for step in (3, 4):
        for key in RESUMED_KEYS:
            assert got[step][key] == want[step][key], (step, key, got[step][key],
                                                        want[step][key])


def test_override_optimizer_config_takes_optimizer_fields_only():
    from siirl.engine.megatron.transformer_overrides import optimizer_overrides
    from siirl.errors import ConfigError

    key = f"{ACTOR}.optim.override_optimizer_config"
    assert optimizer_overrides({"initial_loss_scale": 256, "hysteresis": 1}, key) == {
        "initial_loss_scale": 256, "hysteresis": 1}
    with pytest.raises(ConfigError, match="lr come from the role's own keys"):
        optimizer_overrides({"lr": 1.0}, key)
    with pytest.raises(ConfigError, match="initial_loss_scal .did you mean initial_loss_scale"):
        optimizer_overrides({"initial_loss_scal": 2}, key)


def _moe_rank(rank: int, world: int, port: int, out: str) -> None:
    """One of 2 data-parallel ranks, one expert-parallel group (EP 2): an fp32 and an fp16
    tiny-MoE actor's first update on this rank's rows."""
    from megatron.core import parallel_state

    from siirl.engine.megatron.joint_loss_scale import JointGradScaler

    start_gloo_rank(rank, world, port, 120)
    ep2 = ("actor_rollout_ref.model.path=builtin:tiny-moe", "trainer.n_gpus_per_node=2",
           f"{ACTOR}.megatron.expert_model_parallel_size=2")
    result = {}
    for dtype in ("float32", "float16"):
        actor = _actor(dtype, *ep2)
        if dtype == "float16":
            chain = actor.backend.optimizer.megatron.chained_optimizers
            shared = len(chain) == 2 and chain[0].grad_scaler is chain[1].grad_scaler
            result["one scale"] = shared and isinstance(chain[0].grad_scaler, JointGradScaler)
            chain[0].grad_scaler.scaler._scale = torch.tensor([2.0**8])  # as the dense test
        batch = actor.compute_log_prob(rollout_rows(vocab=20, seed=rank)).batch
        result[dtype] = actor.update_policy(batch).metrics
        result["config"] = actor.module.config
        parallel_state.destroy_model_parallel()
    torch.save(result, f"{out}/rank{rank}.pt")
    finish_rank()


def test_fp16_moe_at_ep_2_scales_dense_and_experts_as_one_and_trains_like_fp32(tmp_path):
    """At EP 2 megatron steps the dense and the expert weights with two optimizers; both
    unscale by one loss scale (joint_loss_scale), so the update is fp32's within fp16
    rounding on every rank."""
    context = mp.start_processes(_moe_rank, args=(2, free_port(), str(tmp_path)), nprocs=2,
                                 join=False, start_method="spawn")
    join_spawned(context, "the 2-rank fp16 MoE actor run")
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert result["one scale"], rank
        want, got = result["float32"], result["float16"]
        assert got["actor/skipped_steps"] == 0.0, rank
        for key in ("actor/pg_loss", "actor/grad_norm"):
            tol = rounding(torch.float16, bf16_roundings(result["config"], backward=True),
                           abs(want[key]))
            assert abs(got[key] - want[key]) <= tol.atol + tol.rtol * abs(want[key]), \
                (rank, key, got[key], want[key])


def test_one_overflowing_optimizer_moves_the_joint_scale_once_per_step():
    from siirl.engine.megatron.cpu_compat import enable_cpu_mode
    from siirl.engine.megatron.joint_loss_scale import JointGradScaler

    enable_cpu_mode()  # megatron's scaler keeps its scalars on 'cuda' otherwise
    from megatron.core.optimizer.grad_scaler import DynamicGradScaler

    def scaler():
        return DynamicGradScaler(initial_scale=2.0**10, min_scale=1.0, growth_factor=2.0,
                                 backoff_factor=0.5, growth_interval=2, hysteresis=1)

    joint = JointGradScaler(scaler(), 2)
    joint.update(False)  # the dense optimizer's gradients are finite ...
    assert float(joint.scale) == 2.0**10  # ... nothing moves before the experts report
    joint.update(True)  # ... the experts' overflow: one back-off for both
    assert float(joint.scale) == 2.0**9 and float(joint.inv_scale) == 2.0**-9
    for _ in range(2):  # two clean steps (growth_interval 2): grows once, not twice
        joint.update(False)
        joint.update(False)
    assert float(joint.scale) == 2.0**10
