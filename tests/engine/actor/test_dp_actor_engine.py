"""The fsdp actor/reference engines and DataParallelPPOActor on a tiny Llama (CPU, fp32)."""

import copy
import os
from types import SimpleNamespace

import pytest
import torch
from siirl_actor_testlib import (
    RESPONSE,
    actor_config,
    actor_engine,
    max_param_diff,
    one_torch_thread,  # noqa: F401 (autouse fixture: one torch thread per test)
    params,
    ref_logprobs,
    rollout_batch,
    tiny_model,
    tiny_model_terms,
    tiny_tokenizer,
    with_advantages,
)

from siirl.dag_worker.core_algos import agg_loss
from siirl.dag_worker.walk.engine_api import ActorEngine as ActorProtocol
from siirl.dag_worker.walk.engine_api import ReferenceEngine as RefProtocol
from siirl.engine.fsdp.engines import fsdp_engine, fsdp_reference
from siirl.errors import ConfigError, DataError, PipelineError
from siirl_numerics import assert_all_close, assert_close, rounding, scale_of

METRICS = {"actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl",
           "actor/kl_loss", "actor/kl_coef", "actor/entropy", "actor/grad_norm", "actor/lr"}


def _response_logprob(module, batch):
    with torch.no_grad():
        lp, _ = ref_logprobs(module, batch["input_ids"], batch["attention_mask"],
                             batch["position_ids"], RESPONSE)
    return agg_loss(lp, batch["response_mask"], "token-mean").item()


def test_compute_log_prob_shape_and_values():
    engine = actor_engine(actor_config())
    assert isinstance(engine, ActorProtocol)
    batch = rollout_batch(rows=5)  # 5 rows: micro-batches of 2, 2, 1
    out = engine.compute_log_prob(batch)
    assert out.batch["old_log_probs"].shape == (5, RESPONSE)
    assert out.batch["old_log_probs"].dtype == torch.float32
    with torch.no_grad():
        want, ent = ref_logprobs(engine.module, batch["input_ids"], batch["attention_mask"],
                                 batch["position_ids"], RESPONSE, calculate_entropy=True)
    valid = batch["response_mask"].bool()  # padded positions hold nothing by contract
    assert_close(out.batch["old_log_probs"][valid], want[valid], logprob_tolerance(want, 5),
                 "old_log_probs")
    entropy = agg_loss(ent, batch["response_mask"], "token-mean").item()
    assert_close(out.metrics["actor/entropy"], entropy, rounding(
        torch.float32, tiny_model_terms(5), max(abs(entropy), 1.0)), "actor/entropy")


def logprob_tolerance(want, rows):
    """The engine's micro-batched forward and the reference one sum the same terms in
    another order: float32 rounding of the tiny model's reductions."""
    return rounding(torch.float32, tiny_model_terms(rows), scale_of(want), want.numel())


def test_all_masked_rows_report_no_entropy():
    # every group filtered out of the loss: no token to average, so no entropy (not 0)
    batch = rollout_batch(rows=2)
    batch.set("response_mask", torch.zeros_like(batch["response_mask"]))
    engine = actor_engine(actor_config())
    assert "actor/entropy" not in engine.compute_log_prob(batch).metrics
    metrics = engine.update_policy(with_advantages(engine, batch)).metrics
    assert "actor/entropy" not in metrics and metrics["actor/pg_loss"] == 0.0


def test_update_raises_logprob_of_positively_advantaged_responses():
    engine = actor_engine(actor_config("actor_rollout_ref.actor.grad_clip=100.0"))
    batch = with_advantages(engine, rollout_batch(rows=4))
    before = _response_logprob(engine.module, batch)
    metrics = engine.update_policy(batch).metrics
    assert METRICS <= set(metrics)
    assert metrics["actor/kl_loss"] == 0.0 and metrics["actor/kl_coef"] == 0.0
    assert metrics["actor/lr"] == pytest.approx(0.01)
    assert metrics["actor/pg_loss"] == pytest.approx(-1.0, abs=1e-5)  # ratio 1, A = 1
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert _response_logprob(engine.module, batch) > before + 1e-3


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_size_does_not_change_the_gradient(mode):
    model = tiny_model()
    engines = {}
    for micro in (2, 4):
        cfg = actor_config(f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
                           f"actor_rollout_ref.actor.loss_agg_mode={mode}",
                           "actor_rollout_ref.actor.entropy_coeff=0.01")
        engine = actor_engine(cfg, module=copy.deepcopy(model))
        # SGD: Adam's first step is ~lr * sign(grad), which turns float noise in
        # near-zero gradients into lr-sized parameter differences.
        engine.actor.optimizer = torch.optim.SGD(engine.module.parameters(), lr=0.01)
        engine.actor.lr_scheduler = None
        engines[micro] = engine
    batch = rollout_batch(rows=4)  # response lengths 5, 4, 3, 2: uneven token counts
    batch = with_advantages(engines[4], batch)
    batch.set("advantages", batch["advantages"] * torch.linspace(-1, 2, 4)[:, None])
    results = {m: (e.update_policy(batch.clone()).metrics, params(e.module),
                   {n: p.grad.clone() for n, p in e.module.named_parameters()})
               for m, e in engines.items()}
    (metrics_4, params_4, grads_4), (metrics_2, params_2, grads_2) = results[4], results[2]
    assert_close(metrics_2["actor/grad_norm"], metrics_4["actor/grad_norm"], rounding(
        torch.float32, tiny_model_terms(4, "actor/grad_norm"),
        max(metrics_4["actor/grad_norm"], 1.0)), "actor/grad_norm")
    grad_tolerance = lambda w: rounding(  # noqa: E731
        torch.float32, tiny_model_terms(4, "grads"), scale_of(w), w.numel())
    assert_all_close(grads_2, grads_4, grad_tolerance, "gradient ")  # the clipped one
    # SGD moves each weight by lr * gradient: the gradients' tolerance times lr
    assert_all_close(params_2, params_4, lambda w: rounding(
        torch.float32, tiny_model_terms(4, "grads"), 0.01 * max(
            scale_of(g) for g in grads_4.values()) + scale_of(w), w.numel()), "weight ")


def test_grad_clip_caps_the_norm_and_nonfinite_steps_are_skipped():
    engine = actor_engine(actor_config("actor_rollout_ref.actor.grad_clip=0.001"))
    batch = with_advantages(engine, rollout_batch(rows=4))
    metrics = engine.update_policy(batch).metrics
    assert metrics["actor/grad_norm"] > 0.001  # reported before clipping
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    assert torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) <= 0.001 * 1.0001
    assert metrics["actor/skipped_steps"] == 0.0

    before = params(engine.module)
    batch.set("advantages", batch["advantages"] * float("nan"))
    metrics = engine.update_policy(batch).metrics
    assert metrics["actor/skipped_steps"] == 1.0
    assert max_param_diff(params(engine.module), before) == 0.0


def test_epochs_minibatches_and_scheduler_steps():
    cfg = actor_config("actor_rollout_ref.actor.ppo_epochs=2",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                       "actor_rollout_ref.rollout.n=2",  # 2 prompts x n=2 -> 4 rows / mini
                       "actor_rollout_ref.actor.shuffle=true")
    engine = actor_engine(cfg)
    assert engine.actor.mini_batch_rows() == 4
    engine.update_policy(with_advantages(engine, rollout_batch(rows=8)))
    state = next(iter(engine.optimizer.state.values()))
    assert int(state["step"]) == 4  # 2 epochs x 2 mini-batches
    assert engine.lr_scheduler.last_epoch == 1  # once per update_policy call


def test_bad_batch_sizes_and_missing_fields():
    engine = actor_engine(actor_config("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"))
    batch = with_advantages(engine, rollout_batch(rows=4))
    with pytest.raises(ConfigError, match="multiple"):
        engine.update_policy(batch)
    engine = actor_engine(actor_config("actor_rollout_ref.actor.use_kl_loss=true"))
    with pytest.raises(DataError, match="ref_log_prob"):
        engine.update_policy(with_advantages(engine, rollout_batch(rows=4)))


def test_bf16_autocast_runs_and_returns_fp32():
    engine = actor_engine(actor_config(
        "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"))
    fp32 = actor_engine(actor_config(), module=copy.deepcopy(engine.module))
    batch = rollout_batch(rows=2)
    low = engine.compute_log_prob(batch.clone()).batch["old_log_probs"]
    high = fp32.compute_log_prob(batch.clone()).batch["old_log_probs"]
    assert low.dtype == torch.float32
    assert next(engine.module.parameters()).dtype == torch.float32  # master weights
    assert torch.allclose(low, high, atol=0.1)


def _kl_config(*extra):
    return actor_config("actor_rollout_ref.actor.use_kl_loss=true",
                        "actor_rollout_ref.actor.kl_loss_coef=0.5",
                        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", *extra)


def test_kl_loss_is_zero_when_reference_equals_actor():
    cfg = _kl_config()
    actor = actor_engine(cfg)
    worker = SimpleNamespace(rank=0, world_size=1)
    ref = fsdp_reference(cfg, worker, actor=actor, logprob_fn=ref_logprobs)
    assert isinstance(ref, RefProtocol)
    assert ref.module is not actor.module
    initial = params(ref.module)
    batch = ref.compute_ref_log_prob(with_advantages(actor, rollout_batch(rows=4))).batch
    assert_close(batch["ref_log_prob"], batch["old_log_probs"],
                 logprob_tolerance(batch["old_log_probs"], 4), "ref_log_prob")
    metrics = actor.update_policy(batch).metrics
    assert abs(metrics["actor/kl_loss"]) < 1e-7
    assert metrics["actor/kl_coef"] == 0.5
    # the reference stays frozen at the initial weights while the actor moves
    assert max_param_diff(params(ref.module), initial) == 0.0
    assert max_param_diff(params(actor.module), initial) > 0.0
    second = actor.update_policy(batch).metrics
    assert second["actor/kl_loss"] > 0.0


def test_a_reference_without_kl_holds_no_model_and_refuses_to_run():
    # the planner leaves the reference node out then; an engine built anyway says so
    engine = fsdp_engine("reference", actor_config(), None)
    assert engine.module is None
    with pytest.raises(PipelineError, match="planner leaves the reference node out"):
        engine.compute_ref_log_prob(rollout_batch(rows=2))
    with pytest.raises(ConfigError, match="actor, critic, reference"):
        fsdp_engine("rollout", actor_config(), None)


def test_checkpoint_round_trip_resumes_exactly(tmp_path):
    cfg = actor_config("actor_rollout_ref.actor.shuffle=true",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                       "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
                       "actor_rollout_ref.actor.optim.lr_warmup_steps=1",
                       "actor_rollout_ref.actor.optim.total_training_steps=5")
    model = tiny_model()
    first, second = rollout_batch(rows=4, seed=1), rollout_batch(rows=4, seed=2)
    a = actor_engine(cfg, module=copy.deepcopy(model))
    a.update_policy(with_advantages(a, first))
    ckpt_dir = str(tmp_path / "step_1")
    a.save_checkpoint(ckpt_dir)
    a.save_checkpoint(ckpt_dir)  # overwriting a complete checkpoint is fine
    assert sorted(os.listdir(tmp_path)) == ["step_1"]  # no temporary leftovers
    batch = with_advantages(a, second)
    metrics_a = a.update_policy(batch.clone()).metrics

    b = actor_engine(cfg, module=tiny_model(seed=123))  # different weights until loaded
    b.load_checkpoint(ckpt_dir)
    assert b.actor.update_count == 1 and b.lr_scheduler.last_epoch == 1
    metrics_b = b.update_policy(batch.clone()).metrics
    assert max_param_diff(params(a.module), params(b.module)) == 0.0
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/lr"):
        assert metrics_b[key] == metrics_a[key], key
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    assert a.lr_scheduler.state_dict()["last_epoch"] == b.lr_scheduler.state_dict()["last_epoch"]


def test_load_missing_checkpoint(tmp_path):
    engine = actor_engine(actor_config())
    with pytest.raises(DataError, match="no checkpoint"):
        engine.load_checkpoint(str(tmp_path / "absent"))


def test_export_hf_loads_with_transformers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine = actor_engine(actor_config())
    engine.tokenizer = tiny_tokenizer()
    engine.update_policy(with_advantages(engine, rollout_batch(rows=4)))
    out = str(tmp_path / "hf")
    engine.export_hf(out)
    assert any(name.endswith(".safetensors") for name in os.listdir(out))
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert max_param_diff(params(loaded), params(engine.module)) == 0.0
    assert AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("t5") == 5


def test_factory_loads_from_model_path_with_the_shared_logprob_code(tmp_path):
    """The entry-point path: no injection, model loaded from actor_rollout_ref.model.path and
    log-probs from siirl.engine.models.logprob; the reference loads its own copy when no
    actor engine is on the worker, and deep-copies the actor's when there is one."""
    pytest.importorskip("siirl.engine.models.loader")
    model_dir = tmp_path / "model"
    tiny_model().save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    cfg = _kl_config(f"actor_rollout_ref.model.path={model_dir}")
    worker = SimpleNamespace(rank=0, world_size=1)
    actor = fsdp_engine("actor", cfg, worker)
    assert actor.tokenizer.convert_tokens_to_ids("t3") == 3
    copied = fsdp_engine("reference", cfg, worker, peers={"actor": actor})
    loaded = fsdp_engine("reference", cfg, None)
    batch = with_advantages(actor, rollout_batch(rows=4))
    with torch.no_grad():
        want, _ = ref_logprobs(actor.module, batch["input_ids"], batch["attention_mask"],
                               batch["position_ids"], RESPONSE)
    valid = batch["response_mask"].bool()  # padded positions hold 0 by contract
    assert_close(batch["old_log_probs"][valid], want[valid], logprob_tolerance(want, 4),
                 "old_log_probs")
    from_copy = copied.compute_ref_log_prob(batch.clone()).batch["ref_log_prob"]
    batch = loaded.compute_ref_log_prob(batch).batch
    assert_close(from_copy, batch["ref_log_prob"], logprob_tolerance(from_copy, 4),
                 "ref_log_prob of the actor's copy")
    metrics = actor.update_policy(batch).metrics
    assert abs(metrics["actor/kl_loss"]) < 1e-6 and "perf/actor_update_s" in metrics



def test_cosine_schedule_learns_run_length_from_trainer():
    # Only trainer.total_epochs is known when the engine is built; the trainer supplies the
    # step count (set_total_training_steps) before the first update.
    cfg = actor_config("actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
                       "actor_rollout_ref.actor.optim.lr_warmup_steps=1")
    engine = actor_engine(cfg)
    with pytest.raises(ConfigError, match="total_training_steps"):
        engine.update_policy(with_advantages(engine, rollout_batch(rows=4, seed=1)))
    engine = actor_engine(cfg)
    engine.set_total_training_steps(4)
    lrs = [engine.update_policy(with_advantages(engine, rollout_batch(rows=4, seed=s)))
           .metrics["actor/lr"] for s in range(4)]
    assert lrs[0] == pytest.approx(0.0) and lrs[1] == pytest.approx(0.01)
    assert lrs[3] < lrs[2] < lrs[1]


def test_truncated_importance_sampling_metrics_and_required_field():
    """tis_imp_ratio_cap: the update needs rollout_log_probs and reports the ratio's mean
    and the fraction of tokens capped."""
    config = actor_config("actor_rollout_ref.actor.tis_imp_ratio_cap=1.05",
                          "actor_rollout_ref.rollout.name=vllm")  # parsed only
    engine = actor_engine(config)
    batch = with_advantages(engine, rollout_batch(rows=4, seed=1))
    with pytest.raises(DataError, match="rollout_log_probs"):
        engine.update_policy(batch.clone())
    # the engine that sampled gave each token 0.1 less log-prob than the trainer's old policy
    batch.set("rollout_log_probs", (batch["old_log_probs"] - 0.1) * batch["response_mask"])
    metrics = engine.update_policy(batch).metrics
    assert metrics["actor/tis_ratio_mean"] == pytest.approx(torch.exp(torch.tensor(0.1)).item(),
                                                            rel=1e-5)
    assert metrics["actor/tis_capped_frac"] == pytest.approx(1.0)  # 1.105 > 1.05 everywhere


def test_cpgd_estimator_turns_on_the_cpgd_loss_and_its_policy_drift_term():
    """siiRL's CPGD: adv_estimator=cpgd implies use_cpgd_loss; the policy-drift term,
    min(ratio - 1, 2) * log_prob with the ratio detached, is 0 on the update's first pass
    (ratio 1) and the siiRL formula on a stale batch."""
    cfg = actor_config("algorithm.adv_estimator=cpgd",
                       "actor_rollout_ref.actor.policy_drift_coeff=0.5",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")
    assert cfg.actor_rollout_ref.actor.use_cpgd_loss
    actor = actor_engine(cfg)
    batch = with_advantages(actor, rollout_batch(rows=4))
    first = actor.update_policy(batch).metrics
    assert first["actor/policy_drift_loss"] == pytest.approx(0.0, abs=1e-7)
    with torch.no_grad():
        lp, _ = ref_logprobs(actor.module, batch["input_ids"], batch["attention_mask"],
                             batch["position_ids"], RESPONSE)
    ratio = torch.exp(lp - batch["old_log_probs"])
    want = agg_loss(torch.clamp(ratio - 1.0, max=2.0) * lp, batch["response_mask"],
                    "token-mean").item()
    second = actor.update_policy(batch).metrics
    assert want != 0.0 and second["actor/policy_drift_loss"] == pytest.approx(want, rel=1e-5)
    plain = actor_config("actor_rollout_ref.actor.policy_drift_coeff=0.5")
    assert not plain.actor_rollout_ref.actor.use_cpgd_loss  # GRPO: the term stays off
    assert "actor/policy_drift_loss" not in actor_engine(plain).update_policy(
        with_advantages(actor, rollout_batch(rows=4))).metrics
