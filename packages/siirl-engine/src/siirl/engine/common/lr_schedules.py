"""The learning-rate schedules ``optim.warmup_style`` / ``optim.lr_scheduler_type`` name:
the multiplier of the base lr at each scheduler step (verl's formulas).

``LR_SCHEDULES`` is the one table of them. The backends' config sections list it as their
``"lr_schedules"`` name table (``siirl.params.sections.ConfigSection.names``), so
``siirl-train``'s validation pass checks the key against it before torch loads: nothing
here imports torch. ``register_lr_schedule`` adds a schedule in this process (a plugin
module, a notebook); it is then both valid and built (``siirl.engine.common.optim``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

__all__ = ["LR_SCHEDULES", "WarmupSchedule", "register_lr_schedule"]


@dataclass
class WarmupSchedule:
    """Multiplier of the base lr at scheduler step ``step``; a small picklable object, so a
    ``LambdaLR`` built on it checkpoints like any other torch scheduler.

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
        return LR_SCHEDULES[self.style][0](self, step)


Multiplier = Callable[[WarmupSchedule, int], float]


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
LR_SCHEDULES: Dict[str, Tuple[Multiplier, bool]] = {
    "constant": (_constant, False),
    "cosine": (_cosine, True),
}


def register_lr_schedule(name: str, needs_total_steps: bool = False
                         ) -> Callable[[Multiplier], Multiplier]:
    """Decorator adding ``fn(schedule, step) -> multiplier`` as the schedule ``name``
    (``needs_total_steps``: it reads ``schedule.total_steps``, so a run must give them)."""

    def decorate(fn: Multiplier) -> Multiplier:
        current = LR_SCHEDULES.get(name)
        if current is not None and current[0] is not fn:
            raise ValueError(f"lr schedule '{name}' is already registered")
        LR_SCHEDULES[name] = (fn, needs_total_steps)
        return fn

    return decorate
