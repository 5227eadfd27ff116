"""A mixture-of-experts model trains under ``strategy=megatron`` like under fsdp (CPU, GRPO).

The model is the built-in ``builtin:tiny-moe`` (tools/make_tiny_moe.py): tiny-arith
upcycled into a Mixtral with 4 experts, top-2, so that it solves some of the main job's
problems and the policy gradient is not zero. The megatron actor (megatron's MoE layer:
router, SequentialMLP experts, alltoall dispatcher) must give the fsdp actor's (HF
Mixtral's) loss, gradient norm and entropy within 1e-5 relative at steps 1 and 2; step 2
also checks that the experts reached the rollout through the weight sync. With expert
parallelism (EP 2 on two Ray CPU workers, two experts each, tokens exchanged by megatron's
alltoall dispatcher over gloo) it must give EP 1's, and its HF export loads in
transformers and scores what the megatron model (loaded from the same step's checkpoint)
scores.
"""

import pytest
import torch

from siirl_suites import megatron_full

pytest.importorskip("megatron.core")

from test_megatron_bridge import gloo_world_of_one, left_padded_batch  # noqa: E402,F401
from test_megatron_engine import (  # noqa: E402
    MEGATRON,
    assert_close_steps,
    ray_workers,
    steps,
    train,
)

KEYS = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean")


@pytest.fixture(scope="module")
def common():
    return ["actor_rollout_ref.model.path=builtin:tiny-moe", "trainer.total_training_steps=2",
            "trainer.save_freq=-1"]


@pytest.fixture(scope="module")
def fsdp_moe_run(tmp_path_factory, common):
    run = tmp_path_factory.mktemp("fsdp_moe")
    train(run, *common)
    fsdp = steps(run)
    assert fsdp[1]["critic/score/mean"] > 0, "the upcycled model must solve some problems"
    assert fsdp[1]["actor/grad_norm"] > 0
    return fsdp


@pytest.fixture(scope="module")
def megatron_ep1_run(tmp_path_factory, common):
    run = tmp_path_factory.mktemp("megatron_ep1")
    train(run, *MEGATRON, *common)
    return steps(run)


def test_megatron_moe_actor_trains_like_fsdp(megatron_ep1_run, fsdp_moe_run):
    assert_close_steps(megatron_ep1_run, fsdp_moe_run, KEYS)
    assert all(megatron_ep1_run[step]["weight_sync/bytes"] > 0 for step in megatron_ep1_run)


def test_router_aux_loss_is_logged_and_enters_the_gradient(tmp_path, common, megatron_ep1_run):
    """verl's moe_aux_loss_coeff: megatron's load-balancing loss is logged as
    actor/moe_aux_loss (not at all without it) and its gradient is added: step 1 has the
    same rollout and policy loss as the coeff 0 run, another gradient norm."""
    train(tmp_path, *MEGATRON, *common, "trainer.total_training_steps=1",
          "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.1")
    step = steps(tmp_path)[1]
    assert "actor/moe_aux_loss" not in megatron_ep1_run[1]
    assert step["actor/moe_aux_loss"] > 0
    plain = megatron_ep1_run[1]
    for key in ("actor/pg_loss", "critic/score/mean"):
        assert abs(step[key] - plain[key]) <= 1e-5 * max(1.0, abs(plain[key])), key
    assert abs(step["actor/grad_norm"] - plain["actor/grad_norm"]) > 1e-3 * plain[
        "actor/grad_norm"]


@pytest.fixture(scope="module")
def ep2_run(tmp_path_factory, common):
    """Three steps at EP 2 on two workers, checkpointed at step 2."""
    overrides, env = ray_workers(2)
    ep2 = [*MEGATRON, "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
           "actor_rollout_ref.ref.megatron.expert_model_parallel_size=2", *overrides, *common]
    whole = tmp_path_factory.mktemp("ep2")
    train(whole, *ep2, "trainer.total_training_steps=3", "trainer.save_freq=2", env=env)
    return whole, ep2, env


def test_expert_parallel_2_on_two_cpu_workers_trains_like_ep_1_and_fsdp(
        tmp_path, ep2_run, fsdp_moe_run, megatron_ep1_run):
    """Two workers are two data-parallel ranks (each its own rows) and one expert-parallel
    group: the actor and the reference hold 2 of the 4 experts each. The step-2 checkpoint
    (weights and megatron's chained dense + expert optimizer) resumes step 3 exactly."""
    whole, ep2, env = ep2_run
    assert_close_steps(steps(whole), megatron_ep1_run, KEYS)
    assert_close_steps(steps(whole), fsdp_moe_run, KEYS)
    resumed = tmp_path / "resumed"
    train(resumed, *ep2, "trainer.total_training_steps=3", "trainer.resume_mode=resume_path",
          f"trainer.resume_from_path={whole / 'global_step_2'}", env=env)
    assert sorted(steps(resumed)) == [3]
    for key in KEYS:
        assert steps(resumed)[3][key] == steps(whole)[3][key], key


@pytest.mark.usefixtures("gloo_world_of_one")
def test_trained_hf_export_scores_what_the_megatron_model_scores(ep2_run):
    """The step-2 HF export of the EP 2 run (experts gathered over EP) loads in transformers
    and gives, on a left-padded batch, the log-probs of the megatron model read back (at
    EP 1) from the same step's megatron checkpoint: within 1e-5 (float32)."""
    from megatron.core import dist_checkpointing
    from transformers import AutoModelForCausalLM

    from siirl.engine.megatron.model import build_gpt_model, forward_logits
    from siirl.engine.models.loader import tiny_moe_dir

    step = ep2_run[0] / "global_step_2" / "actor"
    hf = AutoModelForCausalLM.from_pretrained(step / "huggingface", dtype=torch.float32).eval()
    assert hf.config.model_type == "mixtral" and hf.config.num_local_experts == 4
    megatron = build_gpt_model(hf.config)
    state = dist_checkpointing.load(megatron.sharded_state_dict(), str(step / "dist_ckpt"))
    megatron.load_state_dict(state)
    megatron.eval()
    shipped = AutoModelForCausalLM.from_pretrained(tiny_moe_dir(), dtype=torch.float32)
    moved = [name for name, p in hf.state_dict().items()
             if not torch.equal(p, shipped.state_dict()[name])]
    assert any(".experts." in name for name in moved), "training moved no expert"
    input_ids, attention_mask, position_ids = left_padded_batch(hf.config.vocab_size)
    with torch.no_grad():
        got = forward_logits(megatron, input_ids, position_ids, attention_mask)
        want = hf(input_ids=input_ids, attention_mask=attention_mask,
                  position_ids=position_ids).logits
    valid = attention_mask.bool()
    worst = (got.log_softmax(-1)[valid] - want.log_softmax(-1)[valid]).abs().max()
    assert worst <= 1e-5, float(worst)


@pytest.mark.slow
@megatron_full
def test_tp_2_by_ep_2_on_four_cpu_workers_trains_like_ep_1(tmp_path, common, megatron_ep1_run):
    """Four workers: TP 2 (with sequence parallelism, which megatron's MoE layer needs under
    TP) x 2 data-parallel ranks, the experts split over EP 2 (and over TP inside each
    expert, expert TP = TP): steps 1 and 2 equal EP 1's within 1e-5."""
    overrides, env = ray_workers(4)
    layout = [f"actor_rollout_ref.{role}.megatron.{key}={value}" for role in ("actor", "ref")
              for key, value in (("tensor_model_parallel_size", 2), ("sequence_parallel", "true"),
                                 ("expert_model_parallel_size", 2))]
    train(tmp_path, *MEGATRON, *layout, *overrides, *common, env=env)
    assert_close_steps(steps(tmp_path), megatron_ep1_run, KEYS)


@pytest.mark.slow
@megatron_full
def test_tp_2_with_whole_experts_at_ep_2_on_two_cpu_workers_trains_like_ep_1(
        tmp_path, common, megatron_ep1_run):
    """Two workers: TP 2 (+ sequence parallelism) over the attention and dense layers, every
    expert whole (expert TP 1) and the experts split over EP 2, through validation, the
    planner and the weight sync: steps 1 and 2 equal EP 1's within 1e-5, and the step-2
    checkpoint (weights and megatron's chained dense + expert optimizer at that layout)
    resumes step 3 exactly (the gloo-rank version: test_megatron_expert_tp.py)."""
    overrides, env = ray_workers(2)
    layout = [f"actor_rollout_ref.{role}.megatron.{key}={value}" for role in ("actor", "ref")
              for key, value in (("tensor_model_parallel_size", 2), ("sequence_parallel", "true"),
                                 ("expert_tensor_parallel_size", 1),
                                 ("expert_model_parallel_size", 2))]
    run = [*MEGATRON, *layout, *overrides, *common, "trainer.total_training_steps=3"]
    whole = tmp_path / "whole"
    train(whole, *run, "trainer.save_freq=2", env=env)
    assert_close_steps(steps(whole), megatron_ep1_run, KEYS)
    resumed = tmp_path / "resumed"
    train(resumed, *run, "trainer.resume_mode=resume_path",
          f"trainer.resume_from_path={whole / 'global_step_2'}", env=env)
    assert sorted(steps(resumed)) == [3]
    for key in KEYS:
        assert steps(resumed)[3][key] == steps(whole)[3][key], key
