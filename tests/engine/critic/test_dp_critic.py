"""The fsdp critic engine, DataParallelPPOCritic and the value model (CPU, fp32)."""

import copy
import json

import pytest
import torch
import torch.multiprocessing as mp
from siirl_critic_testlib import (
    PROMPT,
    RESPONSE,
    critic_config,
    critic_engine,
    dp_rank_main,
    free_port,
    rollout_batch,
    tiny_value_model,
    tiny_value_terms,
    with_values,
)

from siirl.dag_worker.walk.engine_api import CriticEngine as CriticProtocol
from siirl.engine.common import checkpoint
from siirl.engine.critic.value_model import response_values, value_model_from_lm
from siirl.engine.fsdp_workers import fsdp_engine
from siirl.errors import DataError
from siirl_numerics import (
    assert_adam_step_close,
    assert_all_close,
    assert_close,
    assert_metrics_close,
    optimizer_settings,
    rounding,
    scale_of,
    transformer_terms,
)
from siirl_spawn import join_spawned

try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401

    HAVE_FSDP2 = torch.distributed.is_available() and torch.distributed.is_gloo_available()
except ImportError:
    HAVE_FSDP2 = False

METRICS = {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm",
           "critic/lr", "critic/skipped_steps"}


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny tensors gain nothing from threads, and OpenMP workers spin-waiting against
    other processes on a small machine slow these tests several-fold."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _params(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _value_loss(engine, batch) -> float:
    """0.5 * token-mean squared error of the critic's current values against returns."""
    values = engine.critic.compute_values(batch)
    mask = batch["response_mask"]
    return (0.5 * ((values - batch["returns"]) ** 2 * mask).sum() / mask.sum()).item()


def _perturbed(batch, seed: int = 7, scale: float = 0.5):
    """Old values away from the current ones, so the value clip takes effect."""
    noise = torch.randn(batch["values"].shape, generator=torch.Generator().manual_seed(seed))
    batch.set("values", (batch["values"] + scale * noise) * batch["response_mask"])
    return batch


def test_value_alignment_on_tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(
        vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)).float()
    model = value_model_from_lm(lm, seed=0)
    assert model.backbone is lm.model and model._no_split_modules == ["LlamaDecoderLayer"]
    assert not any(k.startswith("lm_head") for k in model.state_dict())
    batch = rollout_batch(rows=4)
    args = (batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    with torch.no_grad():
        values = response_values(model, *args, RESPONSE)
        hidden = lm.model(input_ids=args[0], attention_mask=args[1],
                          position_ids=args[2]).last_hidden_state
        want = model.value_head(hidden).squeeze(-1)[:, PROMPT - 1:PROMPT + RESPONSE - 1]
    assert values.shape == (4, RESPONSE) and values.dtype == torch.float32
    assert_close(values, want, rounding(torch.float32, transformer_terms(
        lm.config, PROMPT + RESPONSE), scale_of(want), want.numel()), "values")
    # values[:, t] is read where token t is predicted: it sees response tokens < t only
    changed = args[0].clone()
    changed[0, PROMPT + 2] = (changed[0, PROMPT + 2] + 1) % 32
    with torch.no_grad():
        moved = response_values(model, changed, args[1], args[2], RESPONSE)
    assert torch.equal(moved[0, :3], values[0, :3])
    assert not torch.allclose(moved[0, 3:], values[0, 3:])
    assert torch.equal(moved[1:], values[1:])


def test_engine_on_builtin_model_is_deterministic_and_masked():
    from siirl.engine.models.loader import load_model

    config = critic_config("algorithm.adv_estimator=gae")
    engine = fsdp_engine("critic", config)
    assert isinstance(engine, CriticProtocol) and not engine.sharded
    lm = load_model(config.critic.model)
    # the policy's weights under a fresh value head
    assert torch.equal(engine.module.backbone.embed_tokens.weight, lm.model.embed_tokens.weight)
    batch = rollout_batch(rows=5)  # forward micro-batches of 2, 2, 1
    out = engine.compute_values(batch.clone())
    values = out.batch["values"]
    assert values.shape == (5, RESPONSE) and values.dtype == torch.float32
    assert torch.equal(values, engine.compute_values(batch.clone()).batch["values"])
    assert torch.all(values[batch["response_mask"] == 0] == 0)
    whole = engine.critic.compute_values(batch)  # one forward per micro-batch: the same
    assert_close(values, whole, rounding(torch.float32, transformer_terms(
        lm.config, PROMPT + RESPONSE), scale_of(whole), whole.numel()), "values")
    assert set(out.metrics) == {"critic/values/mean"}


def test_updates_reduce_value_loss_toward_fixed_returns():
    engine = critic_engine(critic_config("critic.ppo_mini_batch_size=8"))
    batch = rollout_batch(rows=8)
    before = _value_loss(engine, batch)
    losses = []
    for _ in range(15):  # as in training: values first, then the update anchored on them
        metrics = engine.update_critic(with_values(engine, batch.clone())).metrics
        losses.append(metrics["critic/vf_loss"])
    assert METRICS <= set(metrics)
    assert metrics["critic/lr"] == pytest.approx(0.01) and metrics["critic/skipped_steps"] == 0
    assert losses[0] == pytest.approx(before, rel=1e-5)  # first pass: vpreds == values
    assert _value_loss(engine, batch) < 0.2 * before
    assert losses[-1] < 0.2 * losses[0]
    assert engine.critic.update_count == 15


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
def test_micro_batch_size_does_not_change_the_gradient(mode):
    model = tiny_value_model()
    batch = _perturbed(with_values(critic_engine(critic_config(), copy.deepcopy(model)),
                                   rollout_batch(rows=4)))
    results = {}
    for micro in (1, 2, 4):
        config = critic_config(f"critic.ppo_micro_batch_size_per_gpu={micro}",
                               f"critic.loss_agg_mode={mode}", "critic.cliprange_value=0.2")
        engine = critic_engine(config, copy.deepcopy(model))
        metrics = engine.update_critic(batch.clone()).metrics
        grads = {n: p.grad.clone() for n, p in engine.module.named_parameters()}
        results[micro] = (metrics, grads, _params(engine.module), engine.optimizer)
    want_metrics, want_grads, want_params, _ = results[4]
    assert 0 < want_metrics["critic/vf_clipfrac"] < 1  # the clip is part of what is compared
    for micro in (1, 2):
        metrics, grads, weights, _ = results[micro]
        check_update(metrics, want_metrics, grads, want_grads, weights, want_params, 4,
                     optimizer_settings(results[4][3]), f"micro {micro} ")


def test_checkpoint_round_trip_restores_values_and_optimizer(tmp_path):
    config = critic_config("critic.shuffle=true", "critic.ppo_mini_batch_size=2")
    engine = critic_engine(config)
    batch = rollout_batch(rows=4)
    for _ in range(2):
        engine.update_critic(with_values(engine, batch.clone()))
    engine.save_checkpoint(str(tmp_path / "critic"))
    assert {p.name for p in (tmp_path / "critic").iterdir()} == {
        checkpoint.MODEL_FILE, checkpoint.OPTIMIZER_FILE, checkpoint.EXTRA_FILE}

    restored = critic_engine(config, tiny_value_model(seed=1))  # other weights, fresh Adam
    restored.load_checkpoint(str(tmp_path / "critic"))
    assert _max_diff(_params(restored.module), _params(engine.module)) == 0.0
    assert torch.equal(restored.critic.compute_values(batch), engine.critic.compute_values(batch))
    assert restored.critic.update_count == 2
    assert restored.lr_scheduler.state_dict()["last_epoch"] == 2
    for got, want in zip(restored.optimizer.state.values(), engine.optimizer.state.values(),
                         strict=True):
        assert torch.equal(got["exp_avg"], want["exp_avg"])
        assert torch.equal(got["exp_avg_sq"], want["exp_avg_sq"])
    # the next (shuffled) update continues identically
    for each in (engine, restored):
        each.update_critic(with_values(each, batch.clone()))
    assert _max_diff(_params(restored.module), _params(engine.module)) == 0.0


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")
def test_update_checks_fields_and_skips_non_finite_steps():
    engine = critic_engine(critic_config())
    batch = with_values(engine, rollout_batch(rows=4))
    with pytest.raises(DataError, match="returns"):
        engine.update_critic(batch.exclude("returns"))
    before = _params(engine.module)
    batch.set("returns", batch["returns"] * float("nan"))
    metrics = engine.update_critic(batch).metrics
    assert metrics["critic/skipped_steps"] == 1 and metrics["critic/grad_norm"] != 0
    assert _max_diff(_params(engine.module), before) == 0.0


def check_update(metrics, want_metrics, grads, want_grads, weights, want_weights, rows,
                 optim, what):
    """One update of two runs on the same rows: metrics and gradients within float32
    rounding of the computation behind them; weights within what Adam's first step makes
    of the two runs' gradients (a rounding difference near Adam's eps moves a weight by up
    to lr * difference / eps)."""
    assert_metrics_close(metrics, want_metrics, ("critic/vf_loss", "critic/vf_clipfrac",
                                                 "critic/vpred_mean", "critic/grad_norm"),
                         lambda key: tiny_value_terms(rows, key), what)
    assert_all_close(grads, want_grads, lambda w: rounding(
        torch.float32, tiny_value_terms(rows, "grads"), scale_of(w), w.numel()),
        f"{what}gradient ")
    assert_adam_step_close(weights, want_weights, grads, want_grads, **optim, what=what)


def test_lr_schedule_waits_for_the_run_length():
    engine = critic_engine(critic_config("critic.optim.warmup_style=cosine",
                                         "critic.optim.min_lr_ratio=0.0"))
    assert engine.lr_scheduler is None
    engine.set_total_training_steps(4)
    lrs = [engine.update_critic(with_values(engine, rollout_batch(rows=4))).metrics[
        "critic/lr"] for _ in range(3)]
    assert lrs[0] == pytest.approx(0.01) and lrs[0] > lrs[1] > lrs[2]


OVERRIDES = ["critic.ppo_mini_batch_size=8",  # one mini-batch in all
             "critic.ppo_micro_batch_size_per_gpu=2", "critic.cliprange_value=0.2"]


@pytest.mark.skipif(not HAVE_FSDP2, reason="torch build without FSDP2 or gloo")
def test_two_gloo_ranks_match_one_process(tmp_path):
    model = tiny_value_model()
    single = critic_engine(critic_config(*OVERRIDES), module=copy.deepcopy(model))
    batch = with_values(single, rollout_batch(rows=8, seed=3))
    values = batch["values"].clone()
    _perturbed(batch)
    tensors = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids",
                                     "responses", "response_mask", "returns")}
    tensors["old_values"] = batch["values"]
    torch.save({"weights": model.state_dict(), "batch": tensors, "overrides": OVERRIDES},
               tmp_path / "inputs.pt")
    want = single.update_critic(batch.clone()).metrics
    want_grads = {n: p.grad for n, p in single.module.named_parameters()}

    context = mp.start_processes(dp_rank_main, args=(2, free_port(), str(tmp_path)),
                                 nprocs=2, join=False, start_method="spawn")
    join_spawned(context, "the 2-rank FSDP2 run")

    got_values = torch.cat([torch.load(tmp_path / f"values{r}.pt") for r in (0, 1)])
    assert_close(got_values, values, rounding(torch.float32, tiny_value_terms(8),
                                              scale_of(values), values.numel()), "values")
    result = torch.load(tmp_path / "result.pt", weights_only=True)
    for rank in (0, 1):
        got = json.loads((tmp_path / f"metrics{rank}.json").read_text())
        check_update(got, want, result["grads"], want_grads, result["weights"],
                     _params(single.module), 8, optimizer_settings(single.optimizer),
                     f"rank {rank} ")
    assert sorted(p.name for p in (tmp_path / "ckpt" / checkpoint.SHARDED_DIR).iterdir()) == \
        [".metadata", "__0_0.distcp", "__1_0.distcp"]
    plain = copy.deepcopy(single.module)  # the sharded checkpoint loads into one process
    optimizer = torch.optim.AdamW(plain.parameters())
    checkpoint.load_checkpoint(str(tmp_path / "ckpt"), plain, optimizer)
    assert _max_diff(_params(plain), result["weights"]) == 0.0
    assert len(optimizer.state) == len(list(plain.parameters()))
