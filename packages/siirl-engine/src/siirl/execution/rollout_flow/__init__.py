"""siiRL's ``siirl.execution.rollout_flow`` import paths, so siiRL's own multi-turn example
configs (``class_name: siirl.execution.rollout_flow.multiturn.tools.gsm8k_tool.Gsm8kTool``,
``...interactions.gsm8k_interaction.Gsm8kInteraction``) load unchanged, and a user's tool or
interaction subclasses siiRL's base classes (``...multiturn.tools.base_tool.BaseTool``,
``...multiturn.interactions.base.BaseInteraction``) as in siiRL. They are verl-style
stateful tools and interactions, which the multi-turn rollout (siirl-envs) drives."""

# Provided by siirl-core (the episode runner) and siirl-engine (multi-turn tools): the
# path spans every siirl/execution/rollout_flow folder, as siirl.execution's does.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
