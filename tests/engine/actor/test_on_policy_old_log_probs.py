"""On-policy updates take the old log-probs from their own first forward: loss, gradients,
weights and metrics are bitwise those of computing them in a separate forward first. The
planner asks the engine plugin the same question from the config (then it leaves the
old-log-prob node out)."""

import copy

import pytest
import torch
from siirl_actor_testlib import actor_config, actor_engine, params, rollout_batch, tiny_model

from siirl.engine.fsdp_workers import fsdp_engine  # the entry point's object
from siirl.params.typed import to_typed

ON_POLICY = ("data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
             "actor_rollout_ref.actor.entropy_coeff=0.01")


def run_update(cfg, model, batch, separate: bool):
    engine = actor_engine(cfg, module=copy.deepcopy(model))
    batch = batch.clone()
    if separate:
        batch = engine.compute_log_prob(batch).batch
    metrics = engine.update_policy(batch).metrics
    grads = {n: p.grad.clone() for n, p in engine.module.named_parameters()}
    return engine, {k: v for k, v in metrics.items() if not k.startswith("perf/")}, grads


def planner_leaves_it_out(cfg) -> bool:
    """The plugin's answer for one worker (the rows a step gives it: train_batch_size=4)."""
    return fsdp_engine.old_log_probs_from_update(to_typed(cfg), 1)


def advantages(batch):
    batch.set("advantages", batch["response_mask"] * torch.linspace(-1, 2, 4)[:, None])
    return batch


def test_deferred_old_log_probs_are_bitwise_the_separate_ones():
    model, cfg = tiny_model(), actor_config(*ON_POLICY)
    batch = advantages(rollout_batch(rows=4))
    deferred, metrics_d, grads_d = run_update(cfg, model, batch, separate=False)
    assert deferred.actor.on_policy(batch.batch_size[0]) and planner_leaves_it_out(cfg)
    _, metrics_s, grads_s = run_update(cfg, model, batch, separate=True)
    assert metrics_d == metrics_s  # pg_loss, clip fractions, ppo_kl, entropy, grad norm
    assert all(torch.equal(grads_d[n], grads_s[n]) for n in grads_s)
    separate_engine = actor_engine(cfg, module=copy.deepcopy(model))
    separate_engine.update_policy(separate_engine.compute_log_prob(batch.clone()).batch)
    weights = params(separate_engine.module)
    assert all(torch.equal(params(deferred.module)[n], weights[n]) for n in weights)


@pytest.mark.parametrize("off_policy", [
    "actor_rollout_ref.actor.ppo_epochs=2",  # the second epoch starts from new weights
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # so does the second mini-batch
    "actor_rollout_ref.actor.shuffle=true",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",  # other micro-batches
])
def test_off_policy_updates_compute_the_old_log_probs_first(off_policy):
    model, cfg = tiny_model(), actor_config(*ON_POLICY, off_policy)
    batch = advantages(rollout_batch(rows=4))
    engine, metrics_d, grads_d = run_update(cfg, model, batch, separate=False)
    assert not engine.actor.on_policy(batch.batch_size[0])
    assert not planner_leaves_it_out(cfg)
    _, metrics_s, grads_s = run_update(cfg, model, batch, separate=True)
    assert metrics_d == metrics_s
    assert all(torch.equal(grads_d[n], grads_s[n]) for n in grads_s)
