"""The ``fsdp`` engine plugin (entry point ``siirl.engines: fsdp``), at the spec's path of
the FSDP worker.

This module is light (no torch): the planner loads the plugin in the driver process to ask
its on-policy question, :func:`old_log_probs_from_update`. The engines themselves
(:mod:`siirl.engine.fsdp.engines`, torch) are imported when the first one is built, in a
worker; ``fsdp_actor``, ``fsdp_critic`` and ``fsdp_reference`` are read from there on
first use.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from siirl.engine.actor.on_policy import update_gives_old_log_probs

_BUILDERS = ("fsdp_actor", "fsdp_critic", "fsdp_reference")


def fsdp_engine(role: str, config: Any, worker: Any = None,
                peers: Optional[Mapping[str, Any]] = None) -> Any:
    """Entry point ``siirl.engines: fsdp``: the engine of ``role``
    (:func:`siirl.engine.fsdp.engines.fsdp_engine`)."""
    from siirl.engine.fsdp import engines

    return engines.fsdp_engine(role, config, worker, peers)


def old_log_probs_from_update(cfg: Any, workers: int) -> bool:
    """The planner's question (``siirl.engine.actor.on_policy``) for an fsdp actor on
    ``workers`` workers: its data-parallel ranks are the workers over its Ulysses groups."""
    sp = int(cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size or 1)
    return update_gives_old_log_probs(cfg, max(int(workers) // sp, 1))


fsdp_engine.old_log_probs_from_update = old_log_probs_from_update


def __getattr__(name: str) -> Any:
    if name in _BUILDERS:
        from siirl.engine.fsdp import engines

        return getattr(engines, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["fsdp_engine", "old_log_probs_from_update", *_BUILDERS]
