"""PPO critic: a value model on the policy's architecture and its data-parallel trainer.

``CriticEngine`` (role ``critic`` of the fsdp plugin) lives in
``siirl.engine.critic.engine``; it is not imported here, since it builds on
``siirl.engine.fsdp_workers``, which imports this package's engine lazily.
"""

from siirl.engine.critic.dp_critic import DataParallelPPOCritic
from siirl.engine.critic.value_model import ValueModel, build_value_model, response_values

__all__ = ["DataParallelPPOCritic", "ValueModel", "build_value_model", "response_values"]
