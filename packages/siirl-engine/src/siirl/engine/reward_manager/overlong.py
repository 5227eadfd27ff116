"""DAPO's soft overlong punishment (``reward_model.overlong_buffer``).

A response longer than ``max_response_length - len`` loses reward linearly, reaching
``-penalty_factor`` at the length limit:
``penalty = min(-(length - (max_len - len)) / len * penalty_factor, 0)``.
It shapes the reward only: the score a filter or metric reads as correctness (``acc``)
is the scorer's own.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from siirl.engine.common.config import typed_config
from siirl.errors import ConfigError

_CFG = "reward_model.overlong_buffer"


def overlong_penalty(lengths: torch.Tensor, config: Any) -> Optional[torch.Tensor]:
    """Per-row penalty (<= 0) for valid response ``lengths``, or None when disabled."""
    cfg = typed_config(config)
    settings = cfg.reward_model.overlong_buffer
    if not settings.enable:
        return None
    buffer = int(settings.len or 0)
    max_len = cfg.data.max_response_length
    if buffer <= 0 or max_len is None or buffer > int(max_len):
        raise ConfigError(f"{_CFG}.len={buffer} must be in 1..data.max_response_length "
                          f"({max_len}) when {_CFG}.enable is set")
    factor = float(settings.penalty_factor or 0.0)
    exceed = lengths.to(torch.float32) - (int(max_len) - buffer)
    return torch.clamp(-exceed / buffer * factor, max=0.0)
