"""siirl-envs: agentic and embodied environments, registered under ``siirl.environments``.

``TextEnv`` is the API (``reset(seed)``, ``step(action)``, ``render()``, ``close()``);
``make_env(name, settings)`` builds a registered one."""

from siirl.environment.base import Observation, StepResult, TextEnv
from siirl.environment.registry import env_class, envs_from_config, make_env

__all__ = ["Observation", "StepResult", "TextEnv", "env_class", "envs_from_config",
           "make_env"]
