"""Rollout flows: how episodes are scheduled turn by turn (``episode_runner``), shared by
the multi-agent rollout here and the agentic, embodied and multi-turn rollouts of
siirl-envs (``siirl.environment.episodes``)."""

# Provided by siirl-core (the episode runner) and siirl-engine (multi-turn tools): the
# path spans every siirl/execution/rollout_flow folder, as siirl.execution's does.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
