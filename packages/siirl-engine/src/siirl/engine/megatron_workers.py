"""The ``megatron`` engine plugin (entry point ``siirl.engines: megatron``), at the spec's
path of the Megatron worker.

This module is light (no torch, no megatron-core import): the planner loads the plugin in
the driver process to ask its on-policy question, :func:`old_log_probs_from_update`. It
only checks that megatron-core is installed, so without the ``[megatron]`` extra the plugin
registry reports ``pip install "siirl-engine[megatron]"``. The engines
(:mod:`siirl.engine.megatron.engines`) are imported when the first one is built, in a
worker; ``build_megatron_model``, ``init_megatron`` and ``megatron_logprobs`` are read from
their modules on first use.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Mapping, Optional

from siirl.engine.actor.on_policy import update_gives_old_log_probs

if importlib.util.find_spec("megatron") is None or \
        importlib.util.find_spec("megatron.core") is None:
    raise ModuleNotFoundError("No module named 'megatron.core'", name="megatron.core")

_SETUP = ("build_megatron_model", "init_megatron")  # from .megatron.setup
_HEADS = ("megatron_logprobs",)  # from .megatron.heads


def megatron_engine(role: str, config: Any, worker: Optional[Any] = None,
                    peers: Optional[Mapping[str, Any]] = None) -> Any:
    """Entry point ``siirl.engines: megatron``: the engine of ``role``
    (:func:`siirl.engine.megatron.engines.megatron_engine`; the reward model's:
    :func:`siirl.engine.megatron.reward_model.megatron_reward_model`)."""
    if role == "reward_model":
        from siirl.engine.megatron.reward_model import megatron_reward_model

        return megatron_reward_model(config, worker, peers)
    from siirl.engine.megatron import engines

    return engines.megatron_engine(role, config, worker, peers)


def old_log_probs_from_update(cfg: Any, workers: int) -> bool:
    """The planner's question (``siirl.engine.actor.on_policy``) for a megatron actor on
    ``workers`` workers: its data-parallel ranks are the workers over tensor, pipeline and
    context parallelism."""
    layout = cfg.actor_rollout_ref.actor.megatron
    model_parallel = int(layout.tensor_model_parallel_size or 1) * \
        int(layout.pipeline_model_parallel_size or 1) * int(layout.context_parallel_size or 1)
    return update_gives_old_log_probs(cfg, max(int(workers) // model_parallel, 1))


megatron_engine.old_log_probs_from_update = old_log_probs_from_update


def __getattr__(name: str) -> Any:
    if name in _SETUP:
        from siirl.engine.megatron import setup

        return getattr(setup, name)
    if name in _HEADS:
        from siirl.engine.megatron import heads

        return getattr(heads, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["megatron_engine", "old_log_probs_from_update", *_SETUP, *_HEADS]
