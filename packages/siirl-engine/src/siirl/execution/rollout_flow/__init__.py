"""siiRL's ``siirl.execution.rollout_flow`` import paths, so siiRL's own multi-turn example
configs (``class_name: siirl.execution.rollout_flow.multiturn.tools.gsm8k_tool.Gsm8kTool``,
``...interactions.gsm8k_interaction.Gsm8kInteraction``) load unchanged. The classes are
verl-style tools and interactions, which the multi-turn rollout (siirl-envs) drives."""
