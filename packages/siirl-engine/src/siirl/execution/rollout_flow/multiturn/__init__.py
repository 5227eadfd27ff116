"""siiRL's multi-turn tools and interactions (see ``siirl.execution.rollout_flow``)."""
