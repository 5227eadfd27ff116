"""The algorithm side of the built-in nodes: advantages (with the KL penalty in the
reward), and the actor's pause during critic warm-up.

KL in the reward (``algorithm.use_kl_in_reward``) needs the rollout policy's and the
reference's log-probs before advantages: the planner (``siirl.execution.dag.planner``) runs
the ``old_log_prob`` / ``ref_log_prob`` nodes before the advantage node then. The
KL controller (``algorithm.kl_ctrl``: fixed or adaptive) lives for the whole run in the
worker's ``algorithm_objects`` (so checkpoints carry it); with several workers its update
uses the KL of the whole global batch, so every worker's coefficient stays the same.

Several workers train like one: the estimators' batch-wide statistics, the KL controller's
input and the advantage metrics are sums over the rows of every worker that runs the
graph (``core_algos.batch_reduction.reduction_for``; a tensor-parallel peer holding a copy
of another's rows adds nothing), and prompt groups, which the estimators normalise
within, are checked to be whole on one worker.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from siirl.dag_worker.data_structures import NodeOutput
from siirl.dag_worker.walk.dag_utils import call_with_available
from siirl.data_coordinator.fields import (
    ADVANTAGES,
    OLD_LOG_PROBS,
    REF_LOG_PROB,
    RESPONSE_MASK,
    RETURNS,
    REWARD_BASELINES,
    TOKEN_LEVEL_REWARDS,
    UID,
    VALUES,
)
from siirl.errors import DataError, PipelineError

KL_CTRL = "kl_ctrl"
_ESTIMATOR_SETTINGS = ("gamma", "lam", "norm_adv_by_std_in_grpo", "weight_factor_in_cpgd")


class GlobalKLController:
    """A KL controller whose update sees the KL of all workers' rows (row-weighted);
    ``current_kl`` is then the whole batch's."""

    def __init__(self, inner: Any, reduction: Any):
        self.inner, self.reduction = inner, reduction
        self.current_kl: Optional[float] = None

    @property
    def value(self) -> float:
        return self.inner.value

    def update(self, current_kl: float, n_steps: int) -> None:
        kl_sum, rows = self.reduction.sum([float(current_kl) * int(n_steps), int(n_steps)])
        self.current_kl = float(kl_sum) / max(float(rows), 1.0)
        self.inner.update(self.current_kl, int(rows))


def check_groups_whole(index: Any, reduction: Any) -> None:
    """Group statistics are computed where the rows are: a prompt group (``uid``) must not
    have rows on two workers. The built-in rollouts keep a prompt's samples on its worker
    and the DataBuffer moves whole groups; a custom node that splits one stops here."""
    if not reduction.active:
        return
    keys = index.tolist() if hasattr(index, "tolist") else list(index)
    seen: set = set()
    for part in reduction.gather(sorted(set(map(str, keys)))):
        split = seen.intersection(part)
        if split:
            raise DataError(
                f"prompt group uid={sorted(split)[0]!r} has rows on two workers at the "
                "advantage node; group advantages need a group's rows on one worker: move "
                "rows between workers with the DataBuffer, which keeps groups whole, or "
                "give each worker's rows their own uids")
        seen.update(part)


def check_algorithm_names(config: Any) -> None:
    """Unknown estimator or loss names fail here, at start-up, listing the registered ones
    (not at the first step, after models were loaded)."""
    from siirl.dag_worker import core_algos  # torch: not for a driver that only plans

    core_algos.get_adv_estimator_fn(config.algorithm.adv_estimator)
    core_algos.get_policy_loss_fn(config.actor_rollout_ref.actor.policy_loss.loss_mode)


def setup_algorithm_objects(worker: Any, config: Any) -> None:
    """Objects whose state must survive a resume; created before the resume loads it."""
    if config.algorithm.use_kl_in_reward:
        from siirl.dag_worker import core_algos

        worker.algorithm_objects[KL_CTRL] = core_algos.get_kl_controller(
            config.algorithm.kl_ctrl)


def _require_log_probs(batch: Any, node: Any) -> None:
    """KL in the reward reads both log-probs, which the planned graph computes first."""
    missing = [key for key in (OLD_LOG_PROBS, REF_LOG_PROB) if key not in batch.keys()]
    if missing:
        where = f"node '{node.node_id}'" if node is not None else "the advantage node"
        raise PipelineError(
            f"algorithm.use_kl_in_reward=true: {where} needs {', '.join(missing)}, which the "
            "old-log-prob and reference nodes compute before it in a planned graph "
            "(siirl.execution.dag.planner.plan_graph; DAGWorker plans its graph)")


def compute_advantage(worker: Any, batch: Any, config: Any, node: Any = None,
                      reduction: Any = None) -> NodeOutput:
    """Advantages and returns by ``algorithm.adv_estimator`` (see core_algos), with batch
    statistics over every worker's rows (``reduction``: built from ``worker`` and
    ``node`` unless given)."""
    from siirl.dag_worker import core_algos
    from siirl.dag_worker.core_algos.batch_reduction import reduction_for

    if reduction is None:
        reduction = reduction_for(worker, node)
    metrics: Dict[str, Any] = {}
    if config.algorithm.use_kl_in_reward:
        _require_log_probs(batch, node)
        controller = GlobalKLController(worker.algorithm_objects[KL_CTRL], reduction)
        batch, kl_metrics = core_algos.apply_kl_penalty(
            batch, controller, kl_penalty=config.algorithm.kl_penalty)
        kl_metrics["actor/reward_kl_penalty"] = controller.current_kl
        metrics.update(kl_metrics)
    name = config.algorithm.adv_estimator
    estimator = core_algos.get_adv_estimator_fn(name)
    # the estimators' argument names are the field names (verl's), except index <- uid
    sources = {key: batch.get(key, None) for key in
               (TOKEN_LEVEL_REWARDS, RESPONSE_MASK, VALUES, REWARD_BASELINES)}
    if UID in batch.keys():
        from siirl.data_coordinator.protocol import get_non_tensor

        sources["index"] = get_non_tensor(batch, UID)
        check_groups_whole(sources["index"], reduction)
    for key in _ESTIMATOR_SETTINGS:
        sources[key] = getattr(config.algorithm, key)
    sources["reduction"] = reduction
    advantages, returns = call_with_available(estimator, sources,
                                              f"advantage estimator '{name}'")
    batch[ADVANTAGES], batch[RETURNS] = advantages, returns
    metrics.update(advantage_metrics(advantages, returns, batch[RESPONSE_MASK], reduction))
    return NodeOutput(batch=batch, metrics=metrics)


def advantage_metrics(advantages: Any, returns: Any, mask: Any, reduction: Any,
                      prefix: str = "") -> Dict[str, float]:
    """Token means of the advantages and returns over the whole batch; none when every
    row is masked out (all filtered)."""
    import torch

    selected = mask.bool()

    def total(values: Any) -> Any:
        return torch.where(selected, values.to(torch.float64), 0.0).sum()

    adv_sum, ret_sum, tokens = reduction.sum([total(advantages), total(returns),
                                              selected.sum()])
    if tokens <= 0:
        return {}
    return {f"{prefix}critic/advantages/mean": float(adv_sum / tokens),
            f"{prefix}critic/returns/mean": float(ret_sum / tokens)}


def actor_warming_up(worker: Any, config: Any) -> bool:
    """``trainer.critic_warmup=k``: the actor does not train in steps 1..k (the run's own
    step counter), only the critic does."""
    return worker.global_step <= (config.trainer.critic_warmup or 0)
