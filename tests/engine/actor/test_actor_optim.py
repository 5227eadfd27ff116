"""AdamW and the warmup/cosine schedule built from an optim config node."""

import math

import pytest
import torch

from siirl.engine.common.optim import build_lr_scheduler, build_optimizer
from siirl.errors import ConfigError


def _opt(**cfg):
    param = torch.nn.Parameter(torch.zeros(3))
    return build_optimizer([param], {"lr": 0.1, **cfg})


def _lrs(optim_cfg, total, steps):
    opt = _opt()
    sched = build_lr_scheduler(opt, optim_cfg, total)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_build_optimizer_settings():
    opt = _opt(betas=[0.8, 0.95], weight_decay=0.05)
    assert isinstance(opt, torch.optim.AdamW)
    group = opt.param_groups[0]
    assert group["lr"] == 0.1 and group["betas"] == (0.8, 0.95) and group["weight_decay"] == 0.05


def test_build_optimizer_skips_frozen_params():
    frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    live = torch.nn.Parameter(torch.zeros(2))
    opt = build_optimizer([frozen, live], {"lr": 1.0})
    assert opt.param_groups[0]["params"] == [live]


def test_constant_with_warmup_steps():
    assert _lrs({"lr_warmup_steps": 4, "warmup_style": "constant"}, 10, 6) == pytest.approx(
        [0.0, 0.025, 0.05, 0.075, 0.1, 0.1])


def test_warmup_ratio_and_no_warmup():
    assert _lrs({"lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.2}, 10, 3) == pytest.approx(
        [0.0, 0.05, 0.1])
    assert _lrs({}, None, 2) == pytest.approx([0.1, 0.1])


def test_cosine_to_min_lr_ratio():
    total, warmup, min_ratio = 10, 2, 0.1
    got = _lrs({"lr_scheduler_type": "cosine", "lr_warmup_steps": warmup,
                "min_lr_ratio": min_ratio}, total, total + 2)
    for step, lr in enumerate(got):
        if step < warmup:
            want = min_ratio + (1 - min_ratio) * step / warmup
        else:
            progress = (step - warmup) / (total - warmup)
            cos = 0.5 * (1 + math.cos(math.pi * progress))
            want = max(min_ratio, min_ratio + (1 - min_ratio) * cos)
        assert lr == pytest.approx(0.1 * want), step
    assert got[total] == pytest.approx(0.1 * min_ratio)


def test_style_key_precedence():
    # warmup_style alone, and lr_scheduler_type left as its unresolved default
    cosine = {"warmup_style": "cosine", "lr_scheduler_type": "${.warmup_style}"}
    assert _lrs(cosine, 4, 3)[-1] < 0.1
    assert _lrs({"warmup_style": "constant", "lr_scheduler_type": "cosine"}, 4, 3)[-1] < 0.1


def test_schedule_errors():
    with pytest.raises(ConfigError, match="constant"):
        build_lr_scheduler(_opt(), {"warmup_style": "linearish"}, 10)
    with pytest.raises(ConfigError, match="total_training_steps"):
        build_lr_scheduler(_opt(), {"lr_scheduler_type": "cosine"}, None)
    with pytest.raises(ConfigError, match="lr_warmup_steps"):
        build_lr_scheduler(_opt(), {"lr_warmup_steps_ratio": 0.1}, -1)


def test_scheduler_state_dict_round_trip():
    cfg = {"lr_scheduler_type": "cosine", "lr_warmup_steps": 2, "min_lr_ratio": 0.0}
    opt = _opt()
    sched = build_lr_scheduler(opt, cfg, 10)
    for _ in range(5):
        opt.step()
        sched.step()
    state = sched.state_dict()
    fresh_opt = _opt()
    fresh = build_lr_scheduler(fresh_opt, cfg, 10)
    fresh.load_state_dict(state)
    fresh_opt.load_state_dict(opt.state_dict())
    assert fresh.last_epoch == 5
    assert fresh.get_last_lr() == pytest.approx(sched.get_last_lr())
    sched.step()
    fresh.step()
    assert fresh_opt.param_groups[0]["lr"] == pytest.approx(opt.param_groups[0]["lr"])
