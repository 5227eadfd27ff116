"""The algorithm side of the built-in nodes: advantages (with the KL penalty in the
reward), and the actor's pause during critic warm-up.

KL in the reward (``algorithm.use_kl_in_reward``) needs the rollout policy's and the
reference's log-probs before advantages, while the spec's pipelines compute advantages
first. So the advantage node computes them itself in that case, and the later
``old_log_prob`` / ``ref_log_prob`` nodes reuse the fields instead of recomputing them. The
KL controller (``algorithm.kl_ctrl``: fixed or adaptive) lives for the whole run in the
worker's ``algorithm_objects`` (so checkpoints carry it); with several workers its update
uses the KL of the whole global batch, so every worker's coefficient stays the same.
"""

from __future__ import annotations

from typing import Any, Dict

from siirl.dag_worker.dag_utils import call_with_available
from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.fields import (
    ADVANTAGES,
    RESPONSE_MASK,
    RETURNS,
    REWARD_BASELINES,
    TOKEN_LEVEL_REWARDS,
    UID,
    VALUES,
)
from siirl.execution.config_select import select

KL_CTRL = "kl_ctrl"
_ESTIMATOR_SETTINGS = ("gamma", "lam", "norm_adv_by_std_in_grpo", "weight_factor_in_cpgd")


class GlobalKLController:
    """A KL controller whose update sees the KL of all workers' rows (row-weighted)."""

    def __init__(self, inner: Any, comm: Any):
        self.inner, self.comm = inner, comm

    @property
    def value(self) -> float:
        return self.inner.value

    def update(self, current_kl: float, n_steps: int) -> None:
        parts = self.comm.all_gather((float(current_kl), int(n_steps)))
        rows = sum(n for _, n in parts)
        mean_kl = sum(kl * n for kl, n in parts) / max(rows, 1)
        self.inner.update(mean_kl, rows)


def check_algorithm_names(config: Any) -> None:
    """Unknown estimator or loss names fail here, at start-up, listing the registered ones
    (not at the first step, after models were loaded)."""
    from siirl.dag_worker import core_algos  # torch: not for a driver that only plans

    core_algos.get_adv_estimator_fn(select(config, "algorithm.adv_estimator", "grpo"))
    core_algos.get_policy_loss_fn(
        select(config, "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"))


def setup_algorithm_objects(worker: Any, config: Any) -> None:
    """Objects whose state must survive a resume; created before the resume loads it."""
    if select(config, "algorithm.use_kl_in_reward", False):
        from siirl.dag_worker import core_algos

        worker.algorithm_objects[KL_CTRL] = core_algos.get_kl_controller(
            select(config, "algorithm.kl_ctrl"))


def _with_log_probs(worker: Any, batch: Any, metrics: Dict[str, Any]) -> Any:
    """The rollout policy's and the reference's log-probs, by running the worker's own
    ``old_log_prob`` / ``ref_log_prob`` node functions early (they skip later)."""
    for node_fn in (worker.compute_old_log_prob, worker.compute_ref_log_prob):
        out = node_fn(batch)
        batch = out.batch if out.batch is not None else batch
        metrics.update(out.metrics or {})
    return batch


def compute_advantage(worker: Any, batch: Any, config: Any) -> NodeOutput:
    """Advantages and returns by ``algorithm.adv_estimator`` (see core_algos)."""
    from siirl.dag_worker import core_algos

    metrics: Dict[str, Any] = {}
    if select(config, "algorithm.use_kl_in_reward", False):
        batch = _with_log_probs(worker, batch, metrics)
        controller = GlobalKLController(worker.algorithm_objects[KL_CTRL], worker.comm)
        batch, kl_metrics = core_algos.apply_kl_penalty(
            batch, controller, kl_penalty=select(config, "algorithm.kl_penalty", "kl"))
        metrics.update(kl_metrics)
    name = select(config, "algorithm.adv_estimator", "grpo")
    estimator = core_algos.get_adv_estimator_fn(name)
    # the estimators' argument names are the field names (verl's), except index <- uid
    sources = {key: batch.get(key, None) for key in
               (TOKEN_LEVEL_REWARDS, RESPONSE_MASK, VALUES, REWARD_BASELINES)}
    if UID in batch.keys():
        from siirl.data_coordinator.protocol import get_non_tensor

        sources["index"] = get_non_tensor(batch, UID)
    for key in _ESTIMATOR_SETTINGS:
        sources[key] = select(config, f"algorithm.{key}")
    advantages, returns = call_with_available(estimator, sources,
                                              f"advantage estimator '{name}'")
    batch[ADVANTAGES], batch[RETURNS] = advantages, returns
    mask = batch[RESPONSE_MASK].bool()
    if mask.any():  # a worker whose rows are all masked out (filtered) has no mean to give
        metrics.update({"critic/advantages/mean": advantages[mask].mean(),
                        "critic/returns/mean": returns[mask].mean()})
    return NodeOutput(batch=batch, metrics=metrics)


def actor_warming_up(worker: Any, config: Any) -> bool:
    """``trainer.critic_warmup=k``: the actor does not train in steps 1..k (the run's own
    step counter), only the critic does."""
    return worker.global_step <= int(select(config, "trainer.critic_warmup", 0) or 0)
