"""siirl-engine's lr schedules are one table (siirl.engine.common.lr_schedules): the
validation pass accepts what it holds and the optimizer builds it, so a schedule registered
in this process is both valid and used, with no edit in siirl.params."""

import pytest
import torch

from siirl.engine.common.lr_schedules import LR_SCHEDULES, register_lr_schedule
from siirl.engine.common.optim import build_lr_scheduler, build_optimizer
from siirl.params.parser import parse_config
from siirl.params.validation import InvalidConfigError

KEY = "critic.optim.warmup_style"


def _halving(schedule, step):
    return 0.5 ** step


def test_a_registered_schedule_validates_and_is_built():
    name = "test_only_halving"
    with pytest.raises(InvalidConfigError, match=f"{KEY}='{name}': must be one of: "
                       "constant, cosine"):
        parse_config([f"{KEY}={name}"], validate=True)
    try:
        register_lr_schedule(name)(_halving)
        parse_config([f"{KEY}={name}"], validate=True)
        optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(2))], {"lr": 1.0})
        scheduler = build_lr_scheduler(optimizer, {"warmup_style": name}, 4)
        lrs = []
        for _ in range(3):
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        assert lrs == [1.0, 0.5, 0.25]
    finally:
        LR_SCHEDULES.pop(name, None)


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="'cosine' is already registered"):
        register_lr_schedule("cosine")(_halving)
