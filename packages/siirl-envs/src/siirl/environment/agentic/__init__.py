"""Agentic RL on text environments: env managers that turn episodes into training rows."""

from siirl.environment.agentic.trajectory import Episode, Formatter, TrajectoryEnvManager

__all__ = ["Episode", "Formatter", "TrajectoryEnvManager"]
