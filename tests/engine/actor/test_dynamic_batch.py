"""verl's dynamic batch size (use_dynamic_bsz): micro-batches cut by token count give the
same log-probs, values and gradients as fixed micro-batches (fp32, within 1e-6)."""

from collections import defaultdict

import pytest
import torch
from siirl_actor_testlib import (
    actor_config,
    actor_engine,
    max_param_diff,
    one_torch_thread,  # noqa: F401 (autouse fixture: one torch thread per test)
    params,
    rollout_batch,
    with_advantages,
)

from siirl.engine.actor.dp_actor import PolicyLoss
from siirl.engine.common.dynamic_batch import TokenBudget, count, micro_batches, token_plan
from siirl.errors import ConfigError

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
    assert torch.allclose(a, b, atol=1e-6)


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
def test_dynamic_micro_batches_give_the_fixed_gradient_within_1e6(mode):
    engine = actor_engine(actor_config(f"actor_rollout_ref.actor.loss_agg_mode={mode}"))
    batch = with_advantages(engine, rollout_batch(rows=8))
    plan = token_plan(batch, TokenBudget(12, "k"))
    assert 4 <= len(plan) < 8  # micro-batches of uneven row counts
    fixed, dynamic = _gradients(engine, batch, 2), _gradients(engine, batch, plan)
    assert fixed.keys() == dynamic.keys() and fixed
    assert max((fixed[k] - dynamic[k]).abs().max().item() for k in fixed) < 1e-6


def test_a_dynamic_update_runs_and_reports_like_the_fixed_one():
    batch_rows = ["actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    fixed = actor_engine(actor_config(*batch_rows))
    dynamic = actor_engine(actor_config(*batch_rows, *DYNAMIC))
    batch = with_advantages(fixed, rollout_batch(rows=8))
    a = fixed.actor.update_policy(batch.clone())
    b = dynamic.actor.update_policy(batch.clone())
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    # Adam divides by the gradients' own scale: float rounding moves weights ~1e-6
    assert max_param_diff(params(fixed.module), params(dynamic.module)) < 1e-4
