"""bf16 mixed precision of the megatron engine on CPU (``<role>.megatron.dtype=bfloat16``).

* The bf16 GPTModel's log-probs are the fp32 model's within bf16 rounding of the model's
  reductions (weights and compute in bf16, log-softmax in fp32).
* Two gloo ranks (DP 2) train the bf16 model with megatron's DDP (fp32 grad buffers) and
  ``DistributedOptimizer``: each rank keeps fp32 main copies of its shard, the bf16 weights
  are those copies rounded after every step; loss and grad norm stay within bf16 rounding of
  the fp32 run's. Saved with dist_checkpointing after one step and loaded into a fresh
  model and optimizer, the next step equals the uninterrupted run's bit for bit.
* The ``dtype`` key: an unknown name is refused (float16: test_megatron_fp16.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from siirl_numerics import assert_close, rounding, scale_of
from siirl_spawn import finish_rank, join_spawned, start_gloo_rank
from siirl_suites import megatron_full

pytest.importorskip("megatron.core")

from test_megatron_bridge import (  # noqa: E402
    free_port,
    gloo_world_of_one,  # noqa: F401  (fixture)
    init_megatron,
    left_padded_batch,
    tiny_hf_model,
)
from test_megatron_dist_optimizer import _batch, _token_logp_sum  # noqa: E402

LR, CLIP = 1e-2, 1.0
# bf16 roundings on one log-prob's path through a decoder layer of the local spec: bf16
# matmuls accumulate in fp32 and round once per output, so a value is rounded once per
# weight it meets (input norm, QKV, output projection, pre-MLP norm, fc1, fc2) and once per
# op output (norm, QKV, RoPE, scores, softmax probs, context, projection, residual, norm,
# fc1, SwiGLU's activation and product, fc2, residual)
ROUNDINGS_PER_LAYER = 6 + 15
ROUNDINGS_OUTSIDE_LAYERS = 5  # embedding weight, final norm weight and output, head's


def bf16_roundings(config, backward: bool = False) -> int:
    """Roundings to bf16 behind one output of the bf16 model (log-prob or, with
    ``backward``, a gradient: back through the same ops, accumulated in fp32)."""
    forward = int(config.num_hidden_layers) * ROUNDINGS_PER_LAYER + ROUNDINGS_OUTSIDE_LAYERS
    return 2 * forward if backward else forward


def _model(hf, dtype):
    from siirl.engine.megatron.bridge import load_hf_weights
    from siirl.engine.megatron.model import build_gpt_model

    model = build_gpt_model(hf.config, params_dtype=dtype)
    load_hf_weights(model, hf.state_dict(), hf.config)
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_bf16_logprobs_match_fp32_within_bf16_rounding(family, gloo_world_of_one):  # noqa: F811
    from siirl.engine.megatron.heads import megatron_logprobs

    hf = tiny_hf_model(family)
    input_ids, attention_mask, position_ids = left_padded_batch(hf.config.vocab_size)
    response = 6
    with torch.no_grad():
        want, _ = megatron_logprobs(_model(hf, torch.float32).eval(), input_ids,
                                    attention_mask, position_ids, response)
        bf16 = _model(hf, torch.bfloat16).eval()
        assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
        got, _ = megatron_logprobs(bf16, input_ids, attention_mask, position_ids, response)
    assert got.dtype == torch.float32  # the log-softmax runs in fp32 on bf16 logits
    assert not torch.equal(got, want)  # the forward really ran in bf16
    tol = rounding(torch.bfloat16, bf16_roundings(hf.config), scale_of(want), want.numel())
    assert_close(got, want, tol, f"{family} bf16 vs fp32 log-probs")


def _step(ddp_model, optimizer, rank_batch, total_tokens, dp_size):
    from siirl.engine.megatron.optimizer import finish_grad_sync, optimizer_step, zero_grad

    zero_grad(ddp_model, optimizer)
    logp_sum, _ = _token_logp_sum(ddp_model, *rank_batch)
    loss = -logp_sum / total_tokens * dp_size
    loss.backward()
    finish_grad_sync(ddp_model)
    update_ok, grad_norm, _ = optimizer_step(optimizer)
    assert update_ok
    return float(loss) / dp_size, grad_norm


def _assert_weights_are_rounded_main_params(optimizer, what):
    """Every bf16 weight shard this rank updates is its fp32 main shard rounded."""
    sub = optimizer.chained_optimizers[0]
    mains = [p for group in sub.shard_fp32_from_float16_groups for p in group]
    shards = [p for group in sub.shard_float16_groups for p in group]
    assert mains and len(mains) == len(shards)
    for main, shard in zip(mains, shards, strict=True):
        assert main.dtype == torch.float32 and shard.dtype == torch.bfloat16
        assert torch.equal(shard.view(-1), main.view(-1).bfloat16()), what


def rank_main(rank: int, world_size: int, port: int, ckpt_dir: str) -> None:

    from megatron.core import parallel_state

    from siirl.engine.megatron.optimizer import (
        build_distributed_optimizer,
        load_optimizer_checkpoint,
        save_optimizer_checkpoint,
    )

    start_gloo_rank(rank, world_size, port)
    init_megatron(tp=1, pp=1)
    hf = tiny_hf_model("llama")
    batch = _batch(hf.config.vocab_size)
    total_tokens = (batch[1][:, 1:] * batch[1][:, :-1]).sum()
    rank_batch = tuple(t[2 * rank:2 * rank + 2] for t in batch)

    def build(dtype):
        return build_distributed_optimizer(_model(hf, dtype), lr=LR, weight_decay=0.0,
                                           clip_grad=CLIP)

    fp32 = build(torch.float32)
    ddp_model, optimizer = build(torch.bfloat16)
    assert type(optimizer.chained_optimizers[0]).__name__ == "DistributedOptimizer"
    assert ddp_model.ddp_config.grad_reduce_in_fp32
    runs = []
    for step in range(2):
        want = _step(*fp32, rank_batch, total_tokens, world_size)
        got = _step(ddp_model, optimizer, rank_batch, total_tokens, world_size)
        runs.append(got)
        _assert_weights_are_rounded_main_params(optimizer, f"step {step}")
        # the first step starts from the same weights (rounded to bf16): loss and norm
        # within bf16 rounding of the forward (and backward) reductions
        if step == 0:
            assert_close(got[0], want[0], rounding(torch.bfloat16, bf16_roundings(hf.config),
                                                   abs(want[0])), "bf16 vs fp32 loss")
            assert_close(got[1], want[1], rounding(torch.bfloat16, bf16_roundings(
                hf.config, backward=True), want[1]), "bf16 vs fp32 grad norm")

    # one step, save (fp32 main shards + Adam state), load into a fresh model + optimizer:
    # its next step is the uninterrupted run's second, bit for bit
    first_model, first_optimizer = build(torch.bfloat16)
    _step(first_model, first_optimizer, rank_batch, total_tokens, world_size)
    save_optimizer_checkpoint(first_optimizer, first_model, ckpt_dir)
    fresh_model, fresh_optimizer = build(torch.bfloat16)
    load_optimizer_checkpoint(fresh_optimizer, fresh_model, ckpt_dir)
    for (name, got), want in zip(fresh_model.named_parameters(), first_model.parameters(),
                                 strict=True):
        assert torch.equal(got, want), f"{name} after loading"
    assert _step(fresh_model, fresh_optimizer, rank_batch, total_tokens, world_size) == runs[1]
    for got, want in zip(fresh_model.parameters(), ddp_model.parameters(), strict=True):
        assert torch.equal(got, want)
    parallel_state.destroy_model_parallel()
    finish_rank()


def test_dp2_bf16_distributed_optimizer_keeps_fp32_main_params_and_resumes_bitwise(tmp_path):
    context = mp.start_processes(rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2,
                                 join=False, start_method="spawn")
    join_spawned(context, "the 2-rank bf16 megatron run")


def test_dtype_key_takes_the_three_dtypes_and_refuses_other_names():
    from siirl.engine.megatron.mixed_precision import params_dtype
    from siirl.errors import ConfigError

    assert params_dtype("bfloat16", "k") == torch.bfloat16
    assert params_dtype("float32", "k") == torch.float32
    assert params_dtype("float16", "k") == torch.float16  # tests: test_megatron_fp16.py
    with pytest.raises(ConfigError, match="must be one of float32, bfloat16, float16"):
        params_dtype("fp8", "k")


BF16_ROLES = ["actor_rollout_ref.actor.megatron.dtype=bfloat16",
              "actor_rollout_ref.ref.megatron.dtype=bfloat16", "critic.megatron.dtype=bfloat16"]
PPO_BF16 = ["actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron",
            "algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true",
            *BF16_ROLES]
RESUMED_KEYS = ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy",
                "critic/vf_loss", "critic/grad_norm", "critic/score/mean")


@pytest.mark.parametrize("distributed", [
    pytest.param(True, id="dist-optimizer"), pytest.param(False, id="plain", marks=megatron_full)])
def test_bf16_ppo_resumes_bitwise(tmp_path, distributed):
    """PPO with actor, reference and critic in bf16: steps 3 and 4 after a resume from
    step 2's checkpoint (bf16 weights, the fp32 main weights and Adam state of the actor's
    distributed optimizer and of the critic's mixed-precision AdamW) equal the
    uninterrupted run's exactly. Step 4 reads the weights step 3's update made from the
    restored fp32 main weights (step 3's own metrics come from the loaded bf16 weights).
    The weight sync sent bf16 (half fp32's bytes). ``plain``: the actor's megatron
    optimizer without ZeRO sharding (``Float16OptimizerWithFloat16Params``)."""
    from test_megatron_engine import steps, train

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    ppo = [*PPO_BF16, f"actor_rollout_ref.actor.megatron.use_distributed_optimizer={distributed}"]
    train(whole, *ppo, "trainer.total_training_steps=4", "trainer.save_freq=-1")
    train(parts, *ppo, "trainer.total_training_steps=2", "trainer.save_freq=2")
    critic = parts / "global_step_2" / "critic"
    assert (critic / "dist_ckpt").is_dir() and (critic / "optimizer.pt").is_file()
    saved = torch.load(critic / "optimizer.pt", weights_only=True)
    assert all(p.dtype == torch.float32 for group in saved["fp32_from_fp16_params"]
               for p in group)  # the critic's fp32 main weights are in its checkpoint
    train(parts, *ppo, "trainer.total_training_steps=4", "trainer.save_freq=-1")
    want, got = steps(whole), steps(parts)
    for step in (3, 4):
        for key in RESUMED_KEYS:
            assert got[step][key] == want[step][key], (step, key, got[step][key],
                                                        want[step][key])
    bf16_bytes = sum(p.numel() * 2 for p in main_job_policy().parameters())  # tied: once
    assert want[1]["weight_sync/bytes"] == bf16_bytes


def main_job_policy():
    """The main job's policy (the built-in model) in fp32."""
    from siirl.engine.models.loader import load_model_and_tokenizer
    from siirl.params.parser import parse_config

    model, _ = load_model_and_tokenizer(parse_config([]).actor_rollout_ref.model,
                                        dtype=torch.float32)
    return model


@megatron_full
def test_bf16_tensor_parallel_2_on_two_cpu_workers(tmp_path):
    """Two Ray CPU workers form one TP group in bf16: the run trains (finite loss and grad
    norm every step), its TP 2 checkpoint holds the distributed optimizer's state, and the
    first step's grad norm is the fp32 TP 2 run's within bf16 rounding."""
    from test_megatron_engine import MEGATRON, ray_workers, steps, train

    overrides, env = ray_workers(2)
    tp2 = ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", *overrides,
           "trainer.total_training_steps=2"]
    train(tmp_path / "bf16", *MEGATRON, *tp2, "trainer.save_freq=2", *BF16_ROLES[:2],
          env=env)
    train(tmp_path / "fp32", *MEGATRON, *tp2, "trainer.save_freq=-1", env=env)
    got, want = steps(tmp_path / "bf16"), steps(tmp_path / "fp32")
    assert sorted(got) == [1, 2]
    assert all(torch.isfinite(torch.tensor([got[s]["actor/pg_loss"], got[s]["actor/grad_norm"]]))
               .all() for s in got)
    assert got[1]["critic/score/mean"] == want[1]["critic/score/mean"]  # same first rollout
    norm = want[1]["actor/grad_norm"]
    roundings = bf16_roundings(main_job_policy().config, backward=True)
    assert_close(got[1]["actor/grad_norm"], norm, rounding(torch.bfloat16, roundings, norm),
                 "bf16 vs fp32 grad norm at TP 2")
    assert (tmp_path / "bf16" / "global_step_2" / "actor" / "dist_optim" / "layout.json").is_file()


@pytest.mark.parametrize("name,rollout_dtype,trained,sent", [
    ("hf", "bfloat16", torch.float32, torch.float32),  # copied into the hf rollout's module
    ("hf", "float32", torch.bfloat16, torch.bfloat16),
    ("vllm", "bfloat16", torch.float32, torch.bfloat16),  # the server's model dtype
    ("sglang", "fp16", torch.bfloat16, torch.float16),
    ("vllm", "auto", torch.bfloat16, torch.bfloat16),
])
def test_weight_sync_sends_the_rollouts_dtype(name, rollout_dtype, trained, sent):
    from siirl.engine.megatron.mixed_precision import rollout_weight_dtype
    from siirl.params.typed import to_typed

    cfg = to_typed({"actor_rollout_ref": {"rollout": {"name": name, "dtype": rollout_dtype}}})
    assert rollout_weight_dtype(cfg, trained) == sent
