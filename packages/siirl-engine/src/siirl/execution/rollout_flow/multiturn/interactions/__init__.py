"""siiRL's multi-turn interactions: the base class ``base.BaseInteraction`` and its example
``gsm8k_interaction.Gsm8kInteraction``."""
