"""Rollout flows: how episodes are scheduled turn by turn (``episode_runner``), shared by
the multi-agent rollout here and the agentic, embodied and multi-turn rollouts of
siirl-envs (``siirl.environment.episodes``)."""
