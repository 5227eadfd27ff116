"""siirl-envs: agentic and embodied environments, registered under ``siirl.environments``."""
