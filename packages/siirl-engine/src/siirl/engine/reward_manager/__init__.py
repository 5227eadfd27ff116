"""Reward managers: turn decoded responses into ``token_level_scores``.

Names (entry-point group ``siirl.reward_managers``): ``naive`` (one call per row, in
process), ``batch`` (one call on whole lists), ``parallel`` (worker processes with a
per-row timeout). Exports are resolved lazily: the parallel manager's worker processes
import this package, and they must not pay for torch/tensordict, which only the
managers themselves need.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "NaiveRewardManager": "naive",
    "BatchRewardManager": "batch",
    "ParallelRewardManager": "parallel",
    "RewardManagerBase": "base",
    "register": "registry",
    "get_reward_manager_cls": "registry",
    "load_custom_function": "loader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
