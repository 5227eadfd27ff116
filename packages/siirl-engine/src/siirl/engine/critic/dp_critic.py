"""The value role: response values and clipped value-loss updates, on any training backend.

Mirrors ``siirl.engine.actor.dp_actor``: the backend runs the model (a value model), the
shared :class:`~siirl.engine.common.ppo_update.PPOUpdater` runs the update with
:class:`ValueLoss` as its loss.

Loss normalisation: each micro-batch's value loss is weighted by its share of the
mini-batch in the unit ``loss_agg_mode`` averages over (``core_algos.agg_loss_units``),
counted over all data-parallel ranks, so gradient accumulation gives exactly the
gradient of the whole mini-batch's loss, whatever the micro-batch size or data-parallel
split. ``critic/vf_loss`` is weighted the same way; ``critic/vf_clipfrac`` and
``critic/vpred_mean`` are token means, weighted by token share. All are summed over
ranks, so each is the value one process would compute on the whole mini-batch.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from siirl.dag_worker.core_algos import agg_loss_units, compute_value_loss
from siirl.data_coordinator.fields import (
    RESPONSE_MASK,
    RESPONSES,
    RETURNS,
    VALUES,
)
from siirl.engine.common.backend import FORWARD_KEYS, Head, MicroLoss, TrainBackend
from siirl.engine.common.dp_utils import dist_active, require
from siirl.engine.common.dynamic_batch import TokenBudget
from siirl.engine.common.ppo_update import (
    PPOUpdater,
    UpdateSettings,
    UpdatingRole,
    forward_rows,
)
from siirl.params import CriticArguments

UPDATE_KEYS = FORWARD_KEYS + (RESPONSE_MASK, VALUES, RETURNS)

# head factory: response_length -> Head with output "values"
ValueHeads = Callable[[int], Head]


class ValueLoss:
    """Clipped value loss of one critic config, as a ``MiniBatchLoss``."""

    def __init__(self, cfg: CriticArguments, world_size: int, group: Any):
        self.mode = cfg.loss_agg_mode
        self.cliprange = float(cfg.cliprange_value)
        self.world_size, self.group = world_size, group

    def _global_counts(self, mask: torch.Tensor):
        """(tokens, loss units or None) of the mini-batch over all data-parallel ranks."""
        units = agg_loss_units(mask, self.mode)
        none = torch.zeros((), dtype=torch.float64, device=mask.device)
        counts = torch.stack([mask.sum().to(torch.float64), none if units is None else units])
        if dist_active(self.world_size):
            torch.distributed.all_reduce(counts, group=self.group)
        return counts[0], (counts[1] if units is not None else None)

    def bind(self, mini_batch: Any, num_micro: int, totals: Dict[str, float]) -> MicroLoss:
        mode = self.mode
        dp_scale = self.world_size if dist_active(self.world_size) else 1  # grads averaged
        total_tokens, total_units = self._global_counts(mini_batch[RESPONSE_MASK].float())

        def loss_of(micro_batch: Any, outputs: Dict[str, torch.Tensor]) -> torch.Tensor:
            vpreds = outputs["values"]
            mask = micro_batch[RESPONSE_MASK].float()
            vf_loss, vf_clipfrac = compute_value_loss(
                vpreds=vpreds, returns=micro_batch[RETURNS], values=micro_batch[VALUES],
                response_mask=mask, cliprange_value=self.cliprange, loss_agg_mode=mode)
            # this micro-batch's share of the global mini-batch; a sum mode just adds up
            share = (float(agg_loss_units(mask, mode) / total_units.clamp_min(1))
                     if total_units is not None else 1.0)
            token_share = float(mask.sum() / total_tokens.clamp_min(1))
            vpred_mean = (vpreds.detach() * mask).sum() / mask.sum().clamp_min(1)
            totals["critic/vf_loss"] += float(vf_loss.detach()) * share
            totals["critic/vf_clipfrac"] += float(vf_clipfrac) * token_share
            totals["critic/vpred_mean"] += float(vpred_mean) * token_share
            return vf_loss * share * dp_scale

        return loss_of


class DataParallelPPOCritic(UpdatingRole):
    """``compute_values`` and ``update_critic`` of the value model on ``backend``."""

    def __init__(self, backend: TrainBackend, cfg: CriticArguments, heads: ValueHeads,
                 settings: UpdateSettings, *, lr_scheduler: Any = None,
                 forward_micro_batch_size: Optional[int] = None,
                 forward_budget: Optional[TokenBudget] = None):
        super().__init__(backend, PPOUpdater(backend, settings, "critic", lr_scheduler))
        self.config = cfg
        self.heads = heads
        self.forward_micro_batch_size = (forward_micro_batch_size
                                         or cfg.forward_micro_batch_size_per_gpu
                                         or cfg.ppo_micro_batch_size_per_gpu)
        self.forward_budget = forward_budget  # dynamic batch size of the value pass

    def compute_values(self, batch: Any) -> torch.Tensor:
        """Values ``[B, R]`` of the batch's response tokens, zero where ``response_mask``
        (when the batch has one) is 0, as verl leaves them."""
        require(batch, FORWARD_KEYS, "compute_values")
        data = batch.select(*FORWARD_KEYS)
        head = self.heads(data[RESPONSES].shape[-1])
        values = forward_rows(self.backend, data, self.forward_micro_batch_size, head,
                              self.forward_budget)["values"]
        if RESPONSE_MASK in batch.keys():
            values = values * batch[RESPONSE_MASK].to(values.dtype)
        return values

    def update_critic(self, batch: Any) -> Dict[str, float]:
        """``ppo_epochs`` passes of mini-batch updates towards ``returns``; returns metrics."""
        if self.backend.optimizer is None:
            raise RuntimeError("this critic has no optimizer; it can only compute values")
        require(batch, UPDATE_KEYS, "update_critic")
        data = batch.select(*UPDATE_KEYS)
        self.updater.settings.micro_rows()  # a bad micro size fails before any work
        head = self.heads(data[RESPONSES].shape[-1])
        loss = ValueLoss(self.config, self.backend.dp_size, self.backend.dp_group)
        return self.backend.share_metrics(self.updater.update(data, head, loss))
