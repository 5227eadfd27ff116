"""Optimizer and learning-rate schedule built from an ``optim`` config node (verl's keys).

The schedule is a ``LambdaLR`` whose lambda is a small picklable object
(``siirl.engine.common.lr_schedules``, the table of schedules by name), so the scheduler's
``state_dict`` (its step count and the schedule's parameters) checkpoints and restores like
any other torch scheduler.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
from torch.optim.lr_scheduler import LambdaLR

from siirl.engine.common.lr_schedules import LR_SCHEDULES, WarmupSchedule
from siirl.errors import ConfigError
from siirl.params import OptimArguments


def optim_settings(optim_cfg: Any) -> OptimArguments:
    """An ``optim`` node (typed, a DictConfig or a dict) as ``OptimArguments``: unset keys
    take the schema's defaults, ``lr_scheduler_type`` follows ``warmup_style``."""
    if isinstance(optim_cfg, OptimArguments):
        return optim_cfg
    from omegaconf import OmegaConf

    if OmegaConf.is_config(optim_cfg):  # a node of a bigger config: resolve against it
        optim_cfg = OmegaConf.to_container(optim_cfg, resolve=True)
    schema = OmegaConf.structured(OptimArguments)
    return OmegaConf.to_object(OmegaConf.merge(schema, optim_cfg or {}))


def build_optimizer(params: Iterable, optim_cfg: Any) -> torch.optim.AdamW:
    """AdamW with ``lr``, ``betas``, ``weight_decay``; fused kernel where torch has one."""
    params = [p for p in params if getattr(p, "requires_grad", True)]
    optim = optim_settings(optim_cfg)
    kwargs = dict(lr=float(optim.lr), betas=tuple(float(b) for b in optim.betas),
                  weight_decay=float(optim.weight_decay))
    try:
        # AdamW validates fused support (device, dtype, DTensor) at construction, so a
        # build without it fails here, not at the first step.
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, ValueError, TypeError):
        return torch.optim.AdamW(params, **kwargs)


def _style(optim: OptimArguments) -> str:
    # lr_scheduler_type is verl's newer name and follows warmup_style unless set
    style = optim.lr_scheduler_type or optim.warmup_style or "constant"
    if style not in LR_SCHEDULES:
        raise ConfigError(f"optim.lr_scheduler_type/warmup_style={style!r} is not supported; "
                          f"supported: {', '.join(sorted(LR_SCHEDULES))}")
    return str(style)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_cfg: Any,
                       total_training_steps: Optional[int] = None) -> LambdaLR:
    """Warmup (``lr_warmup_steps`` if > 0, else ``lr_warmup_steps_ratio`` * total), then
    constant or cosine decay to ``min_lr_ratio``; stepped once per policy update.

    A wrapper optimizer (megatron's) names the torch optimizer holding its param groups in
    ``torch_optimizer``; the schedule drives that one."""
    optimizer = getattr(optimizer, "torch_optimizer", optimizer)
    optim = optim_settings(optim_cfg)
    total = total_training_steps
    if total is None or total <= 0:
        total = int(optim.total_training_steps)
    style = _style(optim)
    warmup = int(optim.lr_warmup_steps)
    if warmup <= 0:
        ratio = float(optim.lr_warmup_steps_ratio or 0.0)
        if ratio > 0 and total <= 0:
            raise ConfigError("optim.lr_warmup_steps_ratio needs the number of training steps "
                              "(optim.total_training_steps); or set optim.lr_warmup_steps")
        warmup = int(ratio * total) if ratio > 0 else 0
    if LR_SCHEDULES[style][1] and total <= 0:
        raise ConfigError(f"a {style} lr schedule needs optim.total_training_steps > 0")
    schedule = WarmupSchedule(style=style, warmup_steps=warmup, total_steps=max(total, 0),
                              min_lr_ratio=float(optim.min_lr_ratio or 0.0),
                              num_cycles=float(optim.num_cycles))
    return LambdaLR(optimizer, schedule)
