"""Data-parallel PPO actor: response log-probs and clipped-policy updates of one module.

The module may be a plain ``nn.Module`` or one sharded with FSDP2 (``fully_shard``); in
the sharded case every rank runs the same number of forwards on its own rows and FSDP
averages gradients over ranks.

Loss normalisation: each micro-batch's loss is weighted by its share of the mini-batch in
the unit the aggregation mode averages over (tokens for ``token-mean``, non-empty
sequences for the ``seq-mean-*`` modes; see ``core_algos.agg_loss_units``), counted over
all data-parallel ranks. Gradient accumulation therefore gives exactly the gradient of the
mini-batch loss, independent of the micro-batch size and of the data-parallel split
(with equal-sized micro-batches and equal token counts this is the plain micro/mini row
ratio verl uses). Loss metrics (``actor/pg_loss``, ``actor/kl_loss``, ...) are weighted the
same way and summed over ranks, so they are the mini-batch's loss as one process would
compute it on the whole batch, whatever the data-parallel split.

Batches live on the CPU between nodes; each micro-batch is moved to the module's device
for its forward, and results come back to the CPU.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from siirl.dag_worker.core_algos import (
    agg_loss,
    agg_loss_units,
    get_policy_loss_fn,
    kl_penalty,
)
from siirl.data_coordinator.protocol import split
from siirl.engine.dp_utils import clip_grad_norm, dist_active, dp_sum, require
from siirl.errors import ConfigError
from siirl.execution.config_select import select

_FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
_UPDATE_KEYS = _FORWARD_KEYS + ("response_mask", "old_log_probs", "advantages")

# fsdp_config.model_dtype -> autocast dtype; None keeps everything in the weights' dtype
_COMPUTE_DTYPES = {
    "fp32": None, "float32": None,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}


def compute_dtype(fsdp_cfg: Any) -> Optional[torch.dtype]:
    """The autocast dtype ``fsdp_config.model_dtype`` asks for (None: fp32, the default).

    Weights (and so optimizer state) stay in the dtype they were loaded in; a low-precision
    ``model_dtype`` only runs the forward under autocast, and log-probs come back as fp32.
    """
    name = select(fsdp_cfg, "model_dtype")
    if name is None:
        return None
    key = str(name).replace("torch.", "")
    if key not in _COMPUTE_DTYPES:
        raise ConfigError(f"fsdp_config.model_dtype={name!r} is not supported; supported: "
                          f"{', '.join(sorted(_COMPUTE_DTYPES))}")
    return _COMPUTE_DTYPES[key]


def _default_logprob_fn() -> Callable:
    # Imported lazily: the models package is optional for code that injects its own fn.
    from siirl.engine.models.logprob import response_logprobs

    return response_logprobs


class DataParallelPPOActor:
    """``compute_log_prob`` and ``update_policy`` for ``module`` under ``actor_cfg``.

    ``world_size`` is the data-parallel size: mini-batches are ``ppo_mini_batch_size *
    rollout_n / world_size`` rows per rank, and loss normalisers are summed over ranks
    when ``torch.distributed`` is initialised. ``logprob_fn`` defaults to
    ``siirl.engine.models.logprob.response_logprobs``.
    """

    def __init__(self, module: torch.nn.Module, actor_cfg: Any, temperature: float = 1.0, *,
                 optimizer: Optional[torch.optim.Optimizer] = None, lr_scheduler: Any = None,
                 rollout_n: int = 1, world_size: int = 1, seed: int = 0,
                 log_prob_micro_batch_size: Optional[int] = None,
                 logprob_fn: Optional[Callable] = None,
                 autocast_dtype: Optional[torch.dtype] = None, group: Any = None,
                 grad_sync: Optional[Callable[[], None]] = None, tp_group: Any = None):
        self.module = module
        self.tp_group = tp_group  # megatron tensor parallelism: grad norm over shards
        # averages gradients over data-parallel ranks when the module does not (FSDP2 does)
        self.grad_sync = grad_sync
        self.group = group  # the data-parallel process group (None: the default group)
        self.config = actor_cfg
        self.temperature = float(temperature)
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.rollout_n = int(rollout_n)
        self.world_size = int(world_size)
        self.seed = int(seed)
        self.log_prob_micro_batch_size = (
            log_prob_micro_batch_size
            or select(actor_cfg, "log_prob_micro_batch_size_per_gpu")
            or select(actor_cfg, "ppo_micro_batch_size_per_gpu"))
        self._logprob_fn = logprob_fn
        self.autocast_dtype = autocast_dtype
        self.update_count = 0  # update_policy calls so far; checkpointed by the engine

    # ---- forward -------------------------------------------------------------------

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        device = next(self.module.parameters()).device
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)

    def _device(self) -> torch.device:
        return next(self.module.parameters()).device

    def _forward(self, micro: Any, calculate_entropy: bool) -> Tuple[torch.Tensor, Any]:
        fn = self._logprob_fn or _default_logprob_fn()
        micro = micro.to(self._device())
        with self._autocast():
            log_probs, entropy = fn(self.module, micro["input_ids"], micro["attention_mask"],
                                    micro["position_ids"],
                                    response_length=micro["responses"].shape[-1],
                                    temperature=self.temperature,
                                    calculate_entropy=calculate_entropy)
        return log_probs.float(), (entropy.float() if entropy is not None else None)

    @torch.no_grad()
    def compute_log_prob(self, batch: Any, calculate_entropy: bool = False):
        """Log-probs ``[B, R]`` of the batch's responses (and their entropy, or None)."""
        require(batch, _FORWARD_KEYS, "compute_log_prob")
        data = batch.select(*_FORWARD_KEYS)
        rows = data.batch_size[0]
        micro_rows = int(self.log_prob_micro_batch_size or rows or 1)
        self.module.eval()
        outs = [self._forward(micro, calculate_entropy) for micro in split(data, micro_rows)]
        log_probs = torch.cat([lp for lp, _ in outs]).cpu()
        entropy = torch.cat([ent for _, ent in outs]).cpu() if calculate_entropy else None
        return log_probs, entropy

    # ---- update --------------------------------------------------------------------

    def mini_batch_rows(self) -> int:
        """Rows per mini-batch on this rank (verl: prompts * rollout.n / data-parallel size)."""
        prompts = int(select(self.config, "ppo_mini_batch_size", 1))
        rows = prompts * self.rollout_n // self.world_size
        if rows < 1:
            raise ConfigError(f"ppo_mini_batch_size={prompts} * rollout.n={self.rollout_n} is "
                              f"smaller than the data-parallel size {self.world_size}")
        return rows

    def update_policy(self, batch: Any) -> Dict[str, float]:
        """``ppo_epochs`` passes of mini-batch updates over ``batch``; returns metrics."""
        if self.optimizer is None:
            raise RuntimeError("this actor has no optimizer; it can only compute log-probs")
        cfg = self.config
        use_kl = bool(select(cfg, "use_kl_loss", False))
        keys = _UPDATE_KEYS + (("ref_log_prob",) if use_kl else ())
        require(batch, keys, "update_policy" + (" with use_kl_loss" if use_kl else ""))
        data = batch.select(*keys)
        mini = self.mini_batch_rows()
        micro = int(select(cfg, "ppo_micro_batch_size_per_gpu", 0) or mini)
        if mini % micro:
            raise ConfigError(f"the per-rank mini-batch ({mini} rows) must be a multiple of "
                              f"ppo_micro_batch_size_per_gpu={micro}")
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
                skipped += not self._update_mini_batch(mini_batch, micro, use_kl, stats)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.update_count += 1
        grad_norms = stats.pop("actor/grad_norm", None)
        metrics = {key: sum(values) / len(values) for key, values in stats.items()}
        metrics = self._dp_sum(metrics)  # each rank holds its share of the global value
        # the grad norm is already global (clip_grad_norm_ over the sharded parameters)
        metrics["actor/grad_norm"] = (sum(grad_norms) / len(grad_norms) if grad_norms
                                      else float("nan"))  # nan: every step was non-finite
        # The grad norm is global, so every rank skips the same steps.
        metrics["actor/skipped_steps"] = float(skipped)
        kl_coef = float(select(cfg, "kl_loss_coef", 0.001)) if use_kl else 0.0
        metrics.update({"actor/kl_coef": kl_coef, "actor/lr": lr})
        return metrics

    def _update_mini_batch(self, mini_batch: Any, micro: int, use_kl: bool,
                           stats: Dict[str, list]) -> bool:
        """Accumulate over micro-batches, clip, step; False if the step was skipped."""
        mini_batch = mini_batch.to(self._device())
        micro_batches = split(mini_batch, micro)
        loss_of = self._micro_loss_fn(mini_batch, len(micro_batches), use_kl)
        self.optimizer.zero_grad(set_to_none=True)
        totals: Dict[str, float] = defaultdict(float)
        for micro_batch in micro_batches:
            # Entropy is always computed for the metric; it joins the graph only when it
            # is part of the loss.
            log_prob, entropy = self._forward(micro_batch, calculate_entropy=True)
            loss_of(micro_batch, log_prob, entropy, totals).backward()
        return self._finish_mini_batch(totals, stats)

    def _micro_loss_fn(self, mini_batch: Any, num_micro: int, use_kl: bool) -> Callable:
        """``loss(micro_batch, log_prob, entropy, totals)``: the micro-batch's PPO loss
        weighted by its share of the global mini-batch (so summing the micro-batch losses
        gives the mini-batch loss) with its metric shares added to ``totals``."""
        cfg = self.config
        mode = select(cfg, "loss_agg_mode", "token-mean")
        policy_loss_fn = get_policy_loss_fn(select(cfg, "policy_loss.loss_mode", "vanilla"))
        entropy_coeff = float(select(cfg, "entropy_coeff", 0.0))
        kl_coef = float(select(cfg, "kl_loss_coef", 0.001))
        dp_active = dist_active(self.world_size)
        dp_scale = self.world_size if dp_active else 1  # FSDP averages grads over ranks
        total_units = agg_loss_units(mini_batch["response_mask"], mode)
        if total_units is not None and dp_active:
            torch.distributed.all_reduce(total_units, group=self.group)

        def loss_of(micro_batch: Any, log_prob: torch.Tensor, entropy: torch.Tensor,
                    totals: Dict[str, float]) -> torch.Tensor:
            mask = micro_batch["response_mask"].float()
            pg_loss, clipfrac, ppo_kl, clipfrac_lower = policy_loss_fn(
                old_log_prob=micro_batch["old_log_probs"], log_prob=log_prob,
                advantages=micro_batch["advantages"], response_mask=mask,
                loss_agg_mode=mode, config=cfg)
            if entropy_coeff:
                entropy_loss = agg_loss(entropy, mask, mode)
                loss = pg_loss - entropy_coeff * entropy_loss
            else:  # metric only: keep it out of the graph
                entropy_loss = agg_loss(entropy.detach(), mask, mode)
                loss = pg_loss
            kl_loss = torch.zeros(())
            if use_kl:
                kld = kl_penalty(log_prob, micro_batch["ref_log_prob"],
                                 select(cfg, "kl_loss_type", "low_var_kl"))
                kl_loss = agg_loss(kld, mask, mode)
                loss = loss + kl_coef * kl_loss
            # this micro-batch's share of the global mini-batch; a sum mode just adds up
            even = 1.0 / (num_micro * dp_scale)
            share = (float(agg_loss_units(mask, mode) / total_units.clamp_min(1))
                     if total_units is not None else 1.0)
            fraction_weight = share if total_units is not None else even
            for key, value, weight in (
                    ("pg_loss", pg_loss, share), ("entropy", entropy_loss, share),
                    ("kl_loss", kl_loss, share),
                    # fractions are averaged, even when the loss is a sum
                    ("pg_clipfrac", clipfrac, fraction_weight),
                    ("ppo_kl", ppo_kl, fraction_weight),
                    ("pg_clipfrac_lower", clipfrac_lower, fraction_weight)):
                totals[f"actor/{key}"] += float(value.detach()) * weight
            return loss * share * dp_scale

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
        stats["actor/grad_norm"].append(grad_norm)
        return True

    def _clip_grad_norm(self) -> float:
        return clip_grad_norm(self.module, select(self.config, "grad_clip", 1.0), self.tp_group)

    def _dp_sum(self, metrics: Dict[str, float]) -> Dict[str, float]:
        """Sum per-rank shares over data-parallel ranks so every rank has the global value."""
        return dp_sum(metrics, self.world_size, self.group, self._device())
