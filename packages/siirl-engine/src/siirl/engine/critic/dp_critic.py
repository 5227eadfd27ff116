"""Data-parallel PPO critic: response values and clipped value-loss updates of one module.

Mirrors ``siirl.engine.actor.dp_actor``: the module may be plain or sharded with FSDP2;
every rank runs the same number of forwards on its own rows, and FSDP averages gradients
over ranks.

Loss normalisation: each micro-batch's value loss is weighted by its share of the
mini-batch in the unit ``loss_agg_mode`` averages over (``core_algos.agg_loss_units``),
counted over all data-parallel ranks, so gradient accumulation gives exactly the
gradient of the whole mini-batch's loss, whatever the micro-batch size or data-parallel
split. ``critic/vf_loss`` is weighted the same way; ``critic/vf_clipfrac`` and
``critic/vpred_mean`` are token means, weighted by token share. All are summed over
ranks, so each is the value one process would compute on the whole mini-batch.

Batches live on the CPU between nodes; each micro-batch is moved to the module's device
for its forward, and results come back to the CPU.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from typing import Any, Callable, Dict, Optional

import torch

from siirl.dag_worker.core_algos import agg_loss_units, compute_value_loss
from siirl.data_coordinator.protocol import split
from siirl.engine.critic.value_model import response_values
from siirl.engine.dp_utils import clip_grad_norm, dist_active, dp_sum, require
from siirl.errors import ConfigError
from siirl.execution.config_select import select

_FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
_UPDATE_KEYS = _FORWARD_KEYS + ("response_mask", "values", "returns")


class DataParallelPPOCritic:
    """``compute_values`` and ``update_critic`` for ``module`` (a value model) under
    ``critic_cfg`` (the ``critic`` config node).

    ``world_size`` is the data-parallel size: mini-batches are ``ppo_mini_batch_size *
    rollout_n / world_size`` rows per rank. ``value_fn(module, input_ids, attention_mask,
    position_ids, response_length) -> [B, R]`` defaults to
    ``siirl.engine.critic.value_model.response_values``.
    """

    def __init__(self, module: torch.nn.Module, critic_cfg: Any, *,
                 optimizer: Optional[torch.optim.Optimizer] = None, lr_scheduler: Any = None,
                 rollout_n: int = 1, world_size: int = 1, seed: int = 0,
                 forward_micro_batch_size: Optional[int] = None,
                 value_fn: Optional[Callable] = None,
                 autocast_dtype: Optional[torch.dtype] = None, group: Any = None,
                 grad_sync: Optional[Callable[[], None]] = None, tp_group: Any = None):
        self.module = module
        self.grad_sync = grad_sync  # averages gradients when the module does not (FSDP2 does)
        self.tp_group = tp_group  # megatron tensor parallelism: grad norm over shards
        self.config = critic_cfg
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.rollout_n = int(rollout_n)
        self.world_size = int(world_size)
        self.seed = int(seed)
        self.forward_micro_batch_size = (
            forward_micro_batch_size
            or select(critic_cfg, "forward_micro_batch_size_per_gpu")
            or select(critic_cfg, "ppo_micro_batch_size_per_gpu"))
        self.value_fn = value_fn or response_values
        self.autocast_dtype = autocast_dtype
        self.group = group  # the data-parallel process group (None: the default group)
        self.update_count = 0  # update_critic calls so far; checkpointed by the engine

    # ---- forward -------------------------------------------------------------------

    def _device(self) -> torch.device:
        return next(self.module.parameters()).device

    def _forward(self, micro: Any) -> torch.Tensor:
        micro = micro.to(self._device())
        context = (torch.autocast(device_type=self._device().type, dtype=self.autocast_dtype)
                   if self.autocast_dtype is not None else contextlib.nullcontext())
        with context:
            values = self.value_fn(self.module, micro["input_ids"], micro["attention_mask"],
                                   micro["position_ids"], micro["responses"].shape[-1])
        return values.float()

    @torch.no_grad()
    def compute_values(self, batch: Any) -> torch.Tensor:
        """Values ``[B, R]`` of the batch's response tokens, zero where ``response_mask``
        (when the batch has one) is 0, as verl leaves them."""
        require(batch, _FORWARD_KEYS, "compute_values")
        data = batch.select(*_FORWARD_KEYS)
        rows = data.batch_size[0]
        self.module.eval()
        values = torch.cat([self._forward(micro) for micro in
                            split(data, int(self.forward_micro_batch_size or rows or 1))])
        values = values.cpu()
        if "response_mask" in batch.keys():
            values = values * batch["response_mask"].to(values.dtype)
        return values

    # ---- update --------------------------------------------------------------------

    def mini_batch_rows(self) -> int:
        """Rows per mini-batch on this rank (verl: prompts * rollout.n / data-parallel size)."""
        prompts = int(select(self.config, "ppo_mini_batch_size", 1))
        rows = prompts * self.rollout_n // self.world_size
        if rows < 1:
            raise ConfigError(f"critic.ppo_mini_batch_size={prompts} * rollout.n="
                              f"{self.rollout_n} is smaller than the data-parallel size "
                              f"{self.world_size}")
        return rows

    def update_critic(self, batch: Any) -> Dict[str, float]:
        """``ppo_epochs`` passes of mini-batch updates towards ``returns``; returns metrics."""
        if self.optimizer is None:
            raise RuntimeError("this critic has no optimizer; it can only compute values")
        cfg = self.config
        require(batch, _UPDATE_KEYS, "update_critic")
        data = batch.select(*_UPDATE_KEYS)
        mini = self.mini_batch_rows()
        micro = int(select(cfg, "ppo_micro_batch_size_per_gpu", 0) or mini)
        if mini % micro:
            raise ConfigError(f"the per-rank critic mini-batch ({mini} rows) must be a "
                              f"multiple of critic.ppo_micro_batch_size_per_gpu={micro}")
        generator = None
        if select(cfg, "shuffle", False):
            # Seeded per update so a resumed run shuffles exactly like an uninterrupted one.
            generator = torch.Generator().manual_seed(self.seed + self.update_count)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.module.train()
        stats: Dict[str, list] = defaultdict(list)
        skipped = 0
        for _ in range(int(select(cfg, "ppo_epochs", 1))):
            epoch_data = data
            if generator is not None:
                epoch_data = data[torch.randperm(data.batch_size[0], generator=generator)]
            for mini_batch in split(epoch_data, mini):
                skipped += not self._update_mini_batch(mini_batch, micro, stats)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.update_count += 1
        grad_norms = stats.pop("critic/grad_norm", None)
        metrics = {key: sum(values) / len(values) for key, values in stats.items()}
        metrics = self._dp_sum(metrics)  # each rank holds its share of the global value
        # global already (clip_grad_norm_ over the sharded parameters): every rank skips
        # the same steps; nan when every step was non-finite
        metrics["critic/grad_norm"] = (sum(grad_norms) / len(grad_norms) if grad_norms
                                       else float("nan"))
        metrics["critic/skipped_steps"] = float(skipped)
        metrics["critic/lr"] = lr
        return metrics

    def _global_counts(self, mask: torch.Tensor, mode: str):
        """(tokens, loss units or None) of the mini-batch over all data-parallel ranks."""
        units = agg_loss_units(mask, mode)
        none = torch.zeros((), dtype=torch.float64, device=mask.device)
        counts = torch.stack([mask.sum().to(torch.float64), none if units is None else units])
        if dist_active(self.world_size):
            torch.distributed.all_reduce(counts, group=self.group)
        return counts[0], (counts[1] if units is not None else None)

    def _update_mini_batch(self, mini_batch: Any, micro: int, stats: Dict[str, list]) -> bool:
        """Accumulate over micro-batches, clip, step; False if the step was skipped."""
        mini_batch = mini_batch.to(self._device())
        loss_of = self._micro_loss_fn(mini_batch)
        self.optimizer.zero_grad(set_to_none=True)
        totals: Dict[str, float] = defaultdict(float)
        for micro_batch in split(mini_batch, micro):
            loss_of(micro_batch, self._forward(micro_batch), totals).backward()
        return self._finish_mini_batch(totals, stats)

    def _micro_loss_fn(self, mini_batch: Any) -> Callable:
        """``loss(micro_batch, vpreds, totals)``: the micro-batch's value loss weighted by
        its share of the global mini-batch, with its metric shares added to ``totals``."""
        cfg = self.config
        mode = select(cfg, "loss_agg_mode", "token-mean")
        cliprange = float(select(cfg, "cliprange_value", 0.5))
        dp_scale = self.world_size if dist_active(self.world_size) else 1  # FSDP averages
        total_tokens, total_units = self._global_counts(mini_batch["response_mask"].float(),
                                                        mode)

        def loss_of(micro_batch: Any, vpreds: torch.Tensor,
                    totals: Dict[str, float]) -> torch.Tensor:
            mask = micro_batch["response_mask"].float()
            vf_loss, vf_clipfrac = compute_value_loss(
                vpreds=vpreds, returns=micro_batch["returns"], values=micro_batch["values"],
                response_mask=mask, cliprange_value=cliprange, loss_agg_mode=mode)
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

    def _finish_mini_batch(self, totals: Dict[str, float], stats: Dict[str, list]) -> bool:
        """Average gradients over data-parallel ranks, clip, step; False if skipped."""
        for key, value in totals.items():
            stats[key].append(value)
        if self.grad_sync is not None:
            self.grad_sync()
        grad_norm = self._clip_grad_norm()
        if not math.isfinite(grad_norm):  # one bad batch must not poison weights or moments
            self.optimizer.zero_grad(set_to_none=True)
            return False
        self.optimizer.step()
        stats["critic/grad_norm"].append(grad_norm)
        return True

    def _clip_grad_norm(self) -> float:
        return clip_grad_norm(self.module, select(self.config, "grad_clip", 1.0), self.tp_group)

    def _dp_sum(self, metrics: Dict[str, float]) -> Dict[str, float]:
        """Sum per-rank shares over data-parallel ranks so every rank has the global value."""
        return dp_sum(metrics, self.world_size, self.group, self._device())
