"""verl's dynamic batch size (use_dynamic_bsz): micro-batches cut by token count give the
same log-probs, values and gradients as fixed micro-batches (fp32, within the rounding of
another summation order: tests/siirl_numerics.py)."""

from collections import defaultdict

import pytest
import torch
from siirl_actor_testlib import (
    actor_config,
    actor_engine,
    one_torch_thread,  # noqa: F401 (autouse fixture: one torch thread per test)
    params,
    rollout_batch,
    tiny_model_terms,
    with_advantages,
)

from siirl.engine.actor.dp_actor import PolicyLoss
from siirl.engine.common.dynamic_batch import TokenBudget, count, micro_batches, token_plan
from siirl.errors import ConfigError
from siirl_numerics import (
    assert_adam_step_close,
    assert_all_close,
    assert_close,
    assert_metrics_close,
    optimizer_settings,
    rounding,
    scale_of,
)

DYNAMIC = ["actor_rollout_ref.actor.use_dynamic_bsz=true",
           "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=12",
           "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=12"]


def test_a_token_plan_covers_every_row_once_within_the_budget():
    batch = rollout_batch(rows=8)  # 6..9 real tokens per row
    lengths = batch["attention_mask"].sum(-1).tolist()
    plan = token_plan(batch, TokenBudget(20, "k"))
    assert sorted(row for part in plan for row in part) == list(range(8))
    assert len(plan) == -(-sum(lengths) // 20)  # ceil(tokens / budget) micro-batches
    sums = [sum(lengths[r] for r in part) for part in plan]
    assert max(sums) - min(sums) <= max(lengths)  # balanced
    parts, restore = micro_batches(batch, plan)
    rejoined = torch.cat([p["input_ids"] for p in parts])[restore]
    assert torch.equal(rejoined, batch["input_ids"])
    with pytest.raises(ConfigError, match=r"k=5 is below the longest sequence"):
        token_plan(batch, TokenBudget(5, "k"))


def test_dynamic_log_probs_equal_fixed_micro_batches():
    fixed, dynamic = actor_engine(actor_config()), actor_engine(actor_config(*DYNAMIC))
    batch = rollout_batch(rows=8)
    a, _ = fixed.actor.compute_log_prob(batch)
    b, _ = dynamic.actor.compute_log_prob(batch)
    assert dynamic.actor.log_prob_budget.max_tokens == 12
    assert_close(b, a, rounding(torch.float32, tiny_model_terms(8), scale_of(a), a.numel()),
                 "log-probs")


def _gradients(engine, batch, micro):
    """The accumulated gradient of one mini-batch split as ``micro`` says."""
    actor = engine.actor
    head = actor.heads(batch["responses"].shape[-1], actor.temperature, True)
    loss = PolicyLoss(actor.config, 1, None).bind(batch, count(batch.batch_size[0], micro),
                                                  defaultdict(float))
    actor.backend.zero_grad()
    actor.backend.forward_backward_batch(batch, micro, head, loss)
    return {name: p.grad.clone() for name, p in actor.module.named_parameters()
            if p.grad is not None}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_dynamic_micro_batches_give_the_fixed_gradient(mode):
    engine = actor_engine(actor_config(f"actor_rollout_ref.actor.loss_agg_mode={mode}"))
    batch = with_advantages(engine, rollout_batch(rows=8))
    plan = token_plan(batch, TokenBudget(12, "k"))
    assert 4 <= len(plan) < 8  # micro-batches of uneven row counts
    fixed, dynamic = _gradients(engine, batch, 2), _gradients(engine, batch, plan)
    assert fixed.keys() == dynamic.keys() and fixed
    assert_all_close(dynamic, fixed, lambda w: rounding(
        torch.float32, tiny_model_terms(8, "grads"), scale_of(w), w.numel()), "gradient ")


def test_a_dynamic_update_runs_and_reports_like_the_fixed_one():
    batch_rows = ["actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    fixed = actor_engine(actor_config(*batch_rows))
    dynamic = actor_engine(actor_config(*batch_rows, *DYNAMIC))
    batch = with_advantages(fixed, rollout_batch(rows=8))
    a = fixed.actor.update_policy(batch.clone())
    b = dynamic.actor.update_policy(batch.clone())
    assert_metrics_close(b, a, ("actor/pg_loss", "actor/grad_norm", "actor/entropy"),
                         lambda key: tiny_model_terms(8, key))
    # Adam divides by the gradients' own scale: a rounding difference in a gradient near
    # Adam's eps moves its weight by up to lr * difference / eps; that much is allowed
    grads = [{n: p.grad for n, p in e.module.named_parameters()} for e in (fixed, dynamic)]
    assert_adam_step_close(params(dynamic.module), params(fixed.module), grads[1], grads[0],
                           **optimizer_settings(fixed.optimizer))
