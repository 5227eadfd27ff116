"""What every episode loop shares: the runner (who plays which turn; core's
``siirl.execution.rollout_flow.episode_runner``, which the multi-agent rollout uses too),
the environment process pool (``pool``: deadlines, crash containment, restarts), the seeds,
and the engine policy (one reply per episode from the worker's rollout engine; core's
``siirl.execution.rollout_flow.engine_policy``, likewise). The
agentic, embodied and multi-turn loops keep only what is their own: how an observation
becomes tokens, how a reply becomes an action, and what a step is worth."""

from siirl.environment.episodes.seeds import episode_key, episode_seed
from siirl.execution.rollout_flow.engine_policy import EnginePolicy, left_padded
from siirl.execution.rollout_flow.episode_runner import EpisodeRunner

__all__ = ["EnginePolicy", "EpisodeRunner", "episode_key", "episode_seed", "left_padded"]
