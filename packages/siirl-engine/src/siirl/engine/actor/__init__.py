"""Actors: policy log-probs and PPO-style updates.

Importing this package imports no torch: the planner reads ``on_policy`` in the driver
process; ``DataParallelPPOActor`` is read from ``dp_actor`` on first use.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "DataParallelPPOActor":
        from siirl.engine.actor.dp_actor import DataParallelPPOActor

        return DataParallelPPOActor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DataParallelPPOActor"]
