"""siiRL's multi-turn interactions: ``gsm8k_interaction.Gsm8kInteraction``."""
