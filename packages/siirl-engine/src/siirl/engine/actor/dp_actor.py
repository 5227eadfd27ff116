"""The policy role: response log-probs and clipped-policy updates, on any training backend.

:class:`DataParallelPPOActor` is what an actor (or, without an optimizer, a reference)
computes; how the model runs is its backend's business (``siirl.engine.fsdp``: a torch
module, plain or FSDP2-sharded; ``siirl.engine.megatron``: megatron-core's pipeline
schedule). The update loop is the shared :class:`~siirl.engine.common.ppo_update.PPOUpdater`
with :class:`PolicyLoss` as its loss.

Loss normalisation: each micro-batch's loss is weighted by its share of the mini-batch in
the unit the aggregation mode averages over (tokens for ``token-mean``, non-empty
sequences for the ``seq-mean-*`` modes; see ``core_algos.agg_loss_units``), counted over
all data-parallel ranks. Gradient accumulation therefore gives exactly the gradient of the
mini-batch loss, independent of the micro-batch size and of the data-parallel split
(with equal-sized micro-batches and equal token counts this is the plain micro/mini row
ratio verl uses). Loss metrics (``actor/pg_loss``, ``actor/kl_loss``, ...) are weighted the
same way and summed over ranks, so they are the mini-batch's loss as one process would
compute it on the whole batch, whatever the data-parallel split.

Rollout correction (``algorithm.rollout_correction``, ``core_algos.rollout_correction``):
in decoupled mode the weights and the rejection are computed once per batch, before the
update, from the old log-probs against ``rollout_log_probs`` (so the update does not take
its old log-probs from its own first forward); the rejected tokens leave the response mask
and each token's advantage is multiplied by its weight, which for the losses allowed with
weights (``WEIGHTED_LOSSES``: loss positively homogeneous in the advantage) is verl's
weighted per-token loss. In bypass mode the rollout's log-probs are the old log-probs and
every micro-batch compares the current policy with them (verl's ``bypass_mode`` loss); the
loss of the tokens kept is still normalised by the mini-batch's units before rejection, as
verl's global token and sequence counts are.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from siirl.dag_worker.core_algos import (
    ROLLOUT_IS_WEIGHTS,
    agg_loss,
    agg_loss_units,
    correct_rollout,
    get_policy_loss_fn,
    kl_penalty,
    masked_mean,
    reinforce_loss,
    tis_weights,
)
from siirl.data_coordinator.fields import (
    ADVANTAGES,
    OLD_LOG_PROBS,
    REF_LOG_PROB,
    RESPONSE_MASK,
    RESPONSES,
    ROLLOUT_LOG_PROBS,
    ROUTED_EXPERTS,
)
from siirl.engine.actor.on_policy import first_forward_is_log_prob_pass
from siirl.engine.common.backend import (
    FORWARD_KEYS,
    Head,
    MicroLoss,
    TrainBackend,
    forward_keys,
    keep_routing,
)
from siirl.engine.common.dp_utils import dist_active, require
from siirl.engine.common.dynamic_batch import TokenBudget
from siirl.engine.common.ppo_update import (
    PPOUpdater,
    UpdateSettings,
    UpdatingRole,
    forward_rows,
)
from siirl.params import ActorArguments, RolloutCorrectionArguments

UPDATE_KEYS = FORWARD_KEYS + (RESPONSE_MASK, OLD_LOG_PROBS, ADVANTAGES)

# head factory: (response_length, temperature, calculate_entropy) -> Head
LogProbHeads = Callable[[int, float, bool], Head]


class PolicyLoss:
    """PPO policy loss (``policy_loss.loss_mode`` from the registry), entropy bonus and KL
    loss of one actor config, as a :class:`~siirl.engine.common.ppo_update.MiniBatchLoss`."""

    def __init__(self, cfg: ActorArguments, world_size: int, group: Any,
                 on_policy: bool = False,
                 correction: Optional[RolloutCorrectionArguments] = None):
        self.cfg = cfg
        self.correction = correction or RolloutCorrectionArguments()
        # the old log-probs are the update's own first forward, detached (see
        # DataParallelPPOActor.on_policy)
        self.on_policy = on_policy
        self.mode = cfg.loss_agg_mode
        self.policy_loss_fn = get_policy_loss_fn(
            "cpgd" if getattr(cfg, "use_cpgd_loss", False) else cfg.policy_loss.loss_mode)
        # siiRL's CPGD policy-drift term (with the CPGD loss only, as there)
        self.drift_coef = float(getattr(cfg, "policy_drift_coeff", 0.0) or 0.0) \
            if getattr(cfg, "use_cpgd_loss", False) else 0.0
        self.entropy_coeff = float(cfg.entropy_coeff)
        self.use_kl = bool(cfg.use_kl_loss)
        self.kl_coef = float(cfg.kl_loss_coef)
        self.world_size, self.group = world_size, group
        self.tis_cap = float(cfg.tis_imp_ratio_cap or -1.0)

    def bind(self, mini_batch: Any, num_micro: int, totals: Dict[str, float]) -> MicroLoss:
        mode = self.mode
        dp_active = dist_active(self.world_size)
        dp_scale = self.world_size if dp_active else 1  # the backend averages grads over ranks
        total_units = agg_loss_units(mini_batch[RESPONSE_MASK], mode)
        if total_units is not None and dp_active:
            torch.distributed.all_reduce(total_units, group=self.group)

        def loss_of(micro_batch: Any, outputs: Dict[str, torch.Tensor]) -> torch.Tensor:
            log_prob, entropy = outputs["log_probs"], outputs["entropy"]
            correction_metrics: Dict[str, float] = {}
            mask = micro_batch[RESPONSE_MASK].float()
            if self.correction.bypass_mode:
                old_log_prob = micro_batch[ROLLOUT_LOG_PROBS]
            else:
                old_log_prob = (log_prob.detach() if self.on_policy
                                else micro_batch[OLD_LOG_PROBS])
            advantages = micro_batch[ADVANTAGES]
            if ROLLOUT_IS_WEIGHTS in micro_batch.keys():  # decoupled mode's weights (w >= 0)
                advantages = advantages * micro_batch[ROLLOUT_IS_WEIGHTS]
            tis = {}
            if self.tis_cap > 0:  # the engine that sampled against the trainer's old policy
                tis = {"rollout_log_probs": micro_batch[ROLLOUT_LOG_PROBS]}
            if self.correction.bypass_mode:
                pg_loss, clipfrac, ppo_kl, clipfrac_lower = self._bypass_loss(
                    log_prob, old_log_prob, advantages, mask, correction_metrics)
            else:
                pg_loss, clipfrac, ppo_kl, clipfrac_lower = self.policy_loss_fn(
                    old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                    response_mask=mask, loss_agg_mode=mode, config=self.cfg, **tis)
            if self.entropy_coeff:
                entropy_loss = agg_loss(entropy, mask, mode)
                loss = pg_loss - self.entropy_coeff * entropy_loss
            else:  # metric only: keep it out of the graph
                entropy_loss = agg_loss(entropy.detach(), mask, mode)
                loss = pg_loss
            if self.drift_coef:
                drift = torch.clamp(torch.exp(log_prob.detach() - old_log_prob) - 1.0,
                                    max=2.0) * log_prob
                drift_loss = agg_loss(drift, mask, mode)
                loss = loss + self.drift_coef * drift_loss
            kl_loss = torch.zeros(())
            if self.use_kl:
                kld = kl_penalty(log_prob, micro_batch[REF_LOG_PROB], self.cfg.kl_loss_type)
                kl_loss = agg_loss(kld, mask, mode)
                loss = loss + self.kl_coef * kl_loss
            # this micro-batch's share of the global mini-batch; a sum mode just adds up
            even = 1.0 / (num_micro * dp_scale)
            share = (float(agg_loss_units(mask, mode) / total_units.clamp_min(1))
                     if total_units is not None else 1.0)
            fraction_weight = share if total_units is not None else even
            if self.drift_coef:
                totals["actor/policy_drift_loss"] += float(drift_loss.detach()) * share
            for key, value, weight in (
                    ("pg_loss", pg_loss, share), ("entropy", entropy_loss, share),
                    ("kl_loss", kl_loss, share),
                    # fractions are averaged, even when the loss is a sum
                    ("pg_clipfrac", clipfrac, fraction_weight),
                    ("ppo_kl", ppo_kl, fraction_weight),
                    ("pg_clipfrac_lower", clipfrac_lower, fraction_weight)):
                totals[f"actor/{key}"] += float(value.detach()) * weight
            if tis:
                weights = tis_weights(old_log_prob, tis["rollout_log_probs"], self.tis_cap)
                ratio = torch.exp(torch.clamp(old_log_prob - tis["rollout_log_probs"],
                                              -20.0, 20.0))
                totals["actor/tis_ratio_mean"] += float(masked_mean(ratio, mask)) * \
                    fraction_weight
                totals["actor/tis_capped_frac"] += float(masked_mean(
                    (weights < ratio).to(mask.dtype), mask)) * fraction_weight
            for key, value in correction_metrics.items():  # bypass mode's, per micro-batch
                totals[key] += value * fraction_weight
            return loss * share * dp_scale

        return loss_of

    def _bypass_loss(self, log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                     advantages: torch.Tensor, mask: torch.Tensor,
                     metrics: Dict[str, float]):
        """verl's bypass-mode loss: the current policy against the rollout's, weights and
        rejection from that gap; ``ppo_clip`` is the PPO loss (weights for the metrics
        only), ``reinforce`` -w A log pi. The loss over the kept tokens is rescaled to the
        micro-batch's units before rejection, so the mini-batch normalises as verl does."""
        cfg, mode = self.correction, self.mode
        reduce = (lambda t: torch.distributed.all_reduce(t, group=self.group)) \
            if dist_active(self.world_size) else None
        fix = correct_rollout(log_prob, rollout_log_prob, mask, cfg, reduce)
        metrics.update(fix.metrics)
        kept = fix.mask.to(mask.dtype)
        if cfg.loss_type == "reinforce":
            out = reinforce_loss(rollout_log_prob, log_prob, advantages, kept, mode,
                                 fix.weights)
        else:
            out = self.policy_loss_fn(old_log_prob=rollout_log_prob, log_prob=log_prob,
                                      advantages=advantages, response_mask=kept,
                                      loss_agg_mode=mode, config=self.cfg)
        before, after = agg_loss_units(mask, mode), agg_loss_units(kept, mode)
        if before is None or not float(before) > 0:
            return out
        return (out[0] * (after / before), *out[1:])


class DataParallelPPOActor(UpdatingRole):
    """``compute_log_prob`` and ``update_policy`` of the policy on ``backend``.

    ``settings`` is the role's batch arithmetic (``None``: forward only, a reference);
    ``heads`` builds the backend's log-prob head.
    """

    def __init__(self, backend: TrainBackend, cfg: ActorArguments, heads: LogProbHeads, *,
                 temperature: float = 1.0, log_prob_micro_batch_size: Optional[int] = None,
                 log_prob_budget: Optional[TokenBudget] = None,
                 settings: Optional[UpdateSettings] = None, lr_scheduler: Any = None,
                 correction: Optional[RolloutCorrectionArguments] = None):
        super().__init__(backend, PPOUpdater(backend, settings, "actor", lr_scheduler)
                         if settings is not None else None)
        self.config = cfg
        self.correction = correction or RolloutCorrectionArguments()
        self.heads = heads
        self.temperature = float(temperature)
        self.log_prob_micro_batch_size = (log_prob_micro_batch_size
                                          or cfg.ppo_micro_batch_size_per_gpu)
        self.log_prob_budget = log_prob_budget  # dynamic batch size of the log-prob pass

    def compute_log_prob(self, batch: Any, calculate_entropy: bool = False):
        """Log-probs ``[B, R]`` of the batch's responses (and their entropy, or None)."""
        require(batch, FORWARD_KEYS, "compute_log_prob")
        data = batch.select(*forward_keys(batch))
        head = self.heads(data[RESPONSES].shape[-1], self.temperature, calculate_entropy)
        out = forward_rows(self.backend, data, self.log_prob_micro_batch_size, head,
                           self.log_prob_budget)
        return out["log_probs"], out.get("entropy")

    def on_policy(self, rows: int) -> bool:
        """Whether an update of ``rows`` rows starts from the rollout policy's weights and
        reads them exactly as the log-prob pass would (``on_policy``): its first forward
        then gives the old log-probs bit for bit, so none need computing before it."""
        if self.updater is None or self.correction.decoupled:
            return False  # decoupled correction: the whole batch's old log-probs come first
        return first_forward_is_log_prob_pass(self.updater.settings,
                                              self.log_prob_micro_batch_size,
                                              self.log_prob_budget, rows)

    def update_policy(self, batch: Any) -> Dict[str, float]:
        """``ppo_epochs`` passes of mini-batch updates over ``batch``; returns metrics.

        Without ``old_log_probs`` in the batch (the planner left the old-log-prob node out:
        ``on_policy``) they are the update's own first forward; a workflow without that
        node whose update is not on-policy has them computed first."""
        if self.updater is None or self.backend.optimizer is None:
            raise RuntimeError("this actor has no optimizer; it can only compute log-probs")
        self.updater.settings.micro_rows()  # a bad micro size fails before any work
        on_policy, bypass = False, self.correction.bypass_mode
        if OLD_LOG_PROBS not in batch.keys() and not bypass:
            on_policy = self.on_policy(batch.batch_size[0])
            if not on_policy:
                require(batch, FORWARD_KEYS, "update_policy")
                batch.set(OLD_LOG_PROBS, self.compute_log_prob(batch)[0])
                keep_routing(batch, self.backend)
        use_kl = bool(self.config.use_kl_loss)
        keys = UPDATE_KEYS + ((REF_LOG_PROB,) if use_kl else ())
        if float(self.config.tis_imp_ratio_cap or -1.0) > 0 or self.correction.corrects or \
                ROLLOUT_LOG_PROBS in batch.keys():
            keys += (ROLLOUT_LOG_PROBS,)
        if on_policy or bypass:
            keys = tuple(k for k in keys if k != OLD_LOG_PROBS)
        if ROUTED_EXPERTS in batch.keys():  # router replay R2
            keys += (ROUTED_EXPERTS,)
        require(batch, keys, "update_policy" + (" with use_kl_loss" if use_kl else "")
                + (" with algorithm.rollout_correction" if self.correction.corrects else ""))
        data = batch.select(*forward_keys(batch, keys))
        corrected = self._decoupled_correction(data) if not (on_policy or bypass) else {}
        head = self.heads(data[RESPONSES].shape[-1], self.temperature, True)
        loss = PolicyLoss(self.config, self.backend.dp_size, self.backend.dp_group, on_policy,
                          self.correction)
        metrics = self.updater.update(data, head, loss)
        metrics.update(corrected)
        lr = metrics.pop("actor/lr")
        metrics.update({"actor/kl_coef": float(self.config.kl_loss_coef) if use_kl else 0.0,
                        "actor/lr": lr})
        return self.backend.share_metrics(metrics)

    def _decoupled_correction(self, data: Any) -> Dict[str, float]:
        """verl's decoupled mode, on this worker's rows before the update: the weights
        (``ROLLOUT_IS_WEIGHTS``) and the response mask without the rejected tokens go into ``data``;
        the metrics (the old policy against the rollout's) come back. Only the metrics
        when no weights or rejection are asked for, and none without rollout log-probs."""
        if ROLLOUT_LOG_PROBS not in data.keys():
            return {}
        mask = data[RESPONSE_MASK]
        reduce = (lambda t: torch.distributed.all_reduce(t, group=self.backend.dp_group)) \
            if dist_active(self.backend.dp_size) else None
        fix = correct_rollout(data[OLD_LOG_PROBS], data[ROLLOUT_LOG_PROBS], mask,
                              self.correction, reduce)
        if fix.weights is not None:
            data.set(ROLLOUT_IS_WEIGHTS, fix.weights.to(mask.dtype))
        data.set(RESPONSE_MASK, fix.mask.to(mask.dtype))
        return fix.metrics
