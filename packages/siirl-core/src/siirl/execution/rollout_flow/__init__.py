"""Rollout flows that drive the rollout engines over several calls: ``multi_agent`` (agents
taking turns in one episode, siiRL's MARFT workflows)."""
