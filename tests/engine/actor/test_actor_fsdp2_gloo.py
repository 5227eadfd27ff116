"""Data parallelism on CPU, FSDP2-sharded and replicated (``fsdp_size=1``): two gloo ranks,
each with half the batch, must reproduce the loss, gradient norm and gradients of one
process on the whole batch.

The model is a pure-torch causal LM named like an HF one (see siirl_actor_testlib): the
spawned ranks then skip importing transformers, which would double this test's time."""

import copy
import json

import pytest
import torch
import torch.multiprocessing as mp
from siirl_actor_testlib import (
    actor_config,
    actor_engine,
    dp_rank_main,
    free_port,
    max_param_diff,
    params,
    rollout_batch,
    tiny_torch_model,
    tiny_torch_terms,
    with_advantages,
)

from siirl.engine.common import checkpoint
from siirl_numerics import (
    assert_adam_step_close,
    assert_all_close,
    assert_metrics_close,
    optimizer_settings,
    rounding,
    scale_of,
)
from siirl_spawn import join_spawned

try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401

    HAVE_FSDP2 = torch.distributed.is_available() and torch.distributed.is_gloo_available()
except ImportError:
    HAVE_FSDP2 = False

OVERRIDES = ["actor_rollout_ref.actor.ppo_mini_batch_size=8",  # one mini-batch in all
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
             "actor_rollout_ref.actor.entropy_coeff=0.01",
             # the ranks' reference takes the actor's pre-shard copy of its weights
             "actor_rollout_ref.actor.use_kl_loss=true"]


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny tensors gain nothing from threads, and OpenMP workers spin-waiting against
    other processes on a small machine slow these tests several-fold."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.skipif(not HAVE_FSDP2, reason="torch build without FSDP2 or gloo")
@pytest.mark.parametrize("fsdp_size", [-1, 1])
def test_two_gloo_ranks_match_one_process(tmp_path, fsdp_size):
    overrides = OVERRIDES + [f"actor_rollout_ref.actor.fsdp_config.fsdp_size={fsdp_size}"]
    model = tiny_torch_model()
    single = actor_engine(actor_config(*overrides), module=copy.deepcopy(model))
    batch = with_advantages(single, rollout_batch(rows=8, seed=3))
    batch.set("advantages", batch["advantages"] * torch.linspace(-1.0, 2.0, 8)[:, None])
    batch.set("ref_log_prob", batch["old_log_probs"].clone())
    tensors = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids",
                                     "responses", "response_mask", "old_log_probs",
                                     "advantages")}
    torch.save({"weights": model.state_dict(), "batch": tensors, "overrides": overrides},
               tmp_path / "inputs.pt")
    want = single.update_policy(batch.clone()).metrics
    want_grads = {n: p.grad for n, p in single.module.named_parameters()}

    context = mp.start_processes(dp_rank_main, args=(2, free_port(), str(tmp_path)),
                                 nprocs=2, join=False, start_method="spawn")
    join_spawned(context, "the 2-rank FSDP2 run")

    results = [torch.load(tmp_path / f"result{rank}.pt", weights_only=True) for rank in (0, 1)]
    result = results[0]
    for rank in (0, 1):
        got = json.loads((tmp_path / f"metrics{rank}.json").read_text())
        assert_metrics_close(got, want, ("actor/pg_loss", "actor/grad_norm", "actor/entropy",
                                          "actor/ppo_kl", "actor/pg_clipfrac",
                                          "actor/kl_loss"),
                             lambda key: tiny_torch_terms(8, key), f"rank {rank} ")
    assert_all_close(result["grads"], want_grads, lambda w: rounding(
        torch.float32, tiny_torch_terms(8, "grads"), scale_of(w), w.numel()), "gradient ")
    # Adam's first step is ~lr * sign(grad): rounding noise on a gradient near Adam's eps
    # moves its weight by up to lr * noise / eps; what the two gradients explain is allowed
    assert_adam_step_close(result["weights"], params(single.module), result["grads"],
                           want_grads, **optimizer_settings(single.optimizer))
    if fsdp_size == 1:  # the replicas stay bitwise equal (sharded: rank 0 gathers alone)
        assert max_param_diff(results[1]["weights"], result["weights"]) == 0.0
    ckpt_dir = tmp_path / "ckpt"
    if fsdp_size == 1:  # one whole copy, written by rank 0 alone
        assert sorted(p.name for p in ckpt_dir.iterdir()) == \
            sorted([checkpoint.MODEL_FILE, checkpoint.OPTIMIZER_FILE, checkpoint.EXTRA_FILE])
    else:  # one shard file per rank
        assert sorted(p.name for p in (ckpt_dir / checkpoint.SHARDED_DIR).iterdir()) == \
            [".metadata", "__0_0.distcp", "__1_0.distcp"]
    # either layout loads into one plain module
    plain = copy.deepcopy(single.module)
    optimizer = torch.optim.AdamW(plain.parameters())
    checkpoint.load_checkpoint(str(ckpt_dir), plain, optimizer)
    assert max_param_diff(params(plain), result["weights"]) == 0.0
    assert len(optimizer.state) == len(list(plain.parameters()))  # moments restored too
