"""PPO critic: a value model on the policy's architecture, its update role and engine."""

from siirl.engine.critic.dp_critic import DataParallelPPOCritic
from siirl.engine.critic.value_model import ValueModel, build_value_model, response_values

__all__ = ["DataParallelPPOCritic", "ValueModel", "build_value_model", "response_values"]
