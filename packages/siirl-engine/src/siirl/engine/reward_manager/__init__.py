"""Reward managers: turn decoded responses into ``token_level_scores``.

Names (entry-point group ``siirl.reward_managers``): ``naive`` and ``dapo`` (one call per
row), ``batch`` (one call on whole lists), ``parallel`` (rows shared by several worker
processes). Under each, a user's function runs in worker processes (``_pool``,
``worker_main``) and its failures cost only their samples (``outcome``, ``failures``).
Exports are resolved lazily: the worker processes import this package, and they must
not pay for torch/tensordict, which only the managers themselves need.
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
