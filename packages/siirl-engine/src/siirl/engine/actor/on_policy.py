"""Whether the actor's update gives the old log-probs itself: the planner's question.

An update that starts from the rollout policy's weights and reads the rows exactly as the
log-prob pass would (one epoch over one mini-batch, not shuffled, cut into the same
micro-batches or by the same token budget) computes, as its first forward, the old
log-probs bit for bit. The planner (``siirl.execution.dag.planner``) then leaves the
old-log-prob node out of the plan, and the update takes them from that forward
(``DataParallelPPOActor.update_policy``). Both ask the same function,
:func:`first_forward_is_log_prob_pass`: the planner with the rows a worker's actor gets
per step, the update with the rows it was given.
"""

from __future__ import annotations

from typing import Optional

from siirl.engine.common.config import run_seed
from siirl.engine.common.update_settings import (
    TokenBudget,
    UpdateSettings,
    budget,
    turn_row_mini_batches,
)
from siirl.params import SiiRLArguments


def first_forward_is_log_prob_pass(settings: UpdateSettings, log_prob_micro_rows: Optional[int],
                                   log_prob_budget: Optional[TokenBudget], rows: int) -> bool:
    """Whether an update of ``rows`` rows with ``settings`` reads them as the log-prob pass
    (micro-batches of ``log_prob_micro_rows``, or ``log_prob_budget`` tokens) does."""
    if settings.epochs != 1 or settings.shuffle or rows > settings.rows_per_mini_batch(rows):
        return False
    if settings.token_budget is not None or log_prob_budget is not None:
        # the same token plan only for the same budget
        return settings.token_budget is not None and log_prob_budget is not None \
            and settings.token_budget.max_tokens == log_prob_budget.max_tokens
    log_prob_rows = int(log_prob_micro_rows or rows)
    return min(log_prob_rows, rows) == min(settings.micro_rows(), rows)


def actor_update_settings(cfg: SiiRLArguments, dp_size: int) -> UpdateSettings:
    """The batch arithmetic of the actor's update on ``dp_size`` data-parallel ranks."""
    actor_cfg = cfg.actor_rollout_ref.actor
    return UpdateSettings(
        actor_cfg.ppo_mini_batch_size, actor_cfg.ppo_micro_batch_size_per_gpu,
        actor_cfg.ppo_epochs, actor_cfg.shuffle, cfg.actor_rollout_ref.rollout.n, dp_size,
        run_seed(cfg), token_budget=train_budget(cfg),
        mini_batches=turn_row_mini_batches(cfg, actor_cfg.ppo_mini_batch_size))


def train_budget(cfg: SiiRLArguments) -> Optional[TokenBudget]:
    actor_cfg = cfg.actor_rollout_ref.actor
    return budget(actor_cfg.use_dynamic_bsz, actor_cfg.ppo_max_token_len_per_gpu,
                  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu")


def log_prob_budget(cfg: SiiRLArguments) -> Optional[TokenBudget]:
    rollout_cfg = cfg.actor_rollout_ref.rollout
    return budget(rollout_cfg.log_prob_use_dynamic_bsz, rollout_cfg.log_prob_max_token_len_per_gpu,
                  "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu")


def log_prob_micro_rows(cfg: SiiRLArguments) -> Optional[int]:
    """The old-log-prob pass's micro-batch rows (the actor's when the rollout sets none)."""
    ref = cfg.actor_rollout_ref
    return ref.rollout.log_prob_micro_batch_size_per_gpu or ref.actor.ppo_micro_batch_size_per_gpu


def update_gives_old_log_probs(cfg: SiiRLArguments, dp_size: int) -> bool:
    """The planner's question for an actor on ``dp_size`` data-parallel ranks, each given
    ``data.train_batch_size * rollout.n / dp_size`` rows per step."""
    rows = int(cfg.data.train_batch_size) * int(cfg.actor_rollout_ref.rollout.n) // \
        max(int(dp_size), 1)
    if rows < 1 or cfg.algorithm.rollout_correction.decoupled:
        return False  # decoupled rollout correction weighs the batch by them before updating
    return first_forward_is_log_prob_pass(actor_update_settings(cfg, dp_size),
                                          log_prob_micro_rows(cfg), log_prob_budget(cfg), rows)
