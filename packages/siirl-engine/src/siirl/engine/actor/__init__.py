"""Actors: policy log-probs and PPO-style updates."""

from siirl.engine.actor.dp_actor import DataParallelPPOActor

__all__ = ["DataParallelPPOActor"]
