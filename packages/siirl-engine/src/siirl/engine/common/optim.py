"""Optimizer and learning-rate schedule built from an ``optim`` config node (verl's keys).

The schedule is a ``LambdaLR`` whose lambda is a small picklable object, so the
scheduler's ``state_dict`` (its step count and the schedule's parameters) checkpoints and
restores like any other torch scheduler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch
from torch.optim.lr_scheduler import LambdaLR

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


@dataclass
class WarmupSchedule:
    """Multiplier of the base lr at scheduler step ``step`` (verl's formulas).

    constant: linear warmup 0 -> 1, then 1. cosine: linear warmup ``min_lr_ratio`` -> 1,
    then half a cosine (``num_cycles`` = 0.5) down to ``min_lr_ratio`` at
    ``total_steps``.
    """

    style: str
    warmup_steps: int
    total_steps: int
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5

    def __call__(self, step: int) -> float:
        return _STYLES[self.style][0](self, step)


def _constant(s: WarmupSchedule, step: int) -> float:
    if step < s.warmup_steps:
        return step / max(1, s.warmup_steps)
    return 1.0


def _cosine(s: WarmupSchedule, step: int) -> float:
    if step < s.warmup_steps:
        return s.min_lr_ratio + (1.0 - s.min_lr_ratio) * step / max(1, s.warmup_steps)
    progress = (step - s.warmup_steps) / max(1, s.total_steps - s.warmup_steps)
    wave = math.cos(math.pi * s.num_cycles * 2.0 * progress)
    return max(s.min_lr_ratio, (1.0 - s.min_lr_ratio) * 0.5 * wave + (1.0 + s.min_lr_ratio) * 0.5)


# name -> (multiplier, whether it needs the total number of steps)
_STYLES: Dict[str, Tuple[Callable[[WarmupSchedule, int], float], bool]] = {
    "constant": (_constant, False),
    "cosine": (_cosine, True),
}


def _style(optim: OptimArguments) -> str:
    # lr_scheduler_type is verl's newer name and follows warmup_style unless set
    style = optim.lr_scheduler_type or optim.warmup_style or "constant"
    if style not in _STYLES:
        raise ConfigError(f"optim.lr_scheduler_type/warmup_style={style!r} is not supported; "
                          f"supported: {', '.join(sorted(_STYLES))}")
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
    if _STYLES[style][1] and total <= 0:
        raise ConfigError(f"a {style} lr schedule needs optim.total_training_steps > 0")
    schedule = WarmupSchedule(style=style, warmup_steps=warmup, total_steps=max(total, 0),
                              min_lr_ratio=float(optim.min_lr_ratio or 0.0),
                              num_cycles=float(optim.num_cycles))
    return LambdaLR(optimizer, schedule)
