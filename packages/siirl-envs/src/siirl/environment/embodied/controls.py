"""A learning control for EMBODIED runs: the policy's actions reach the environment
permuted (``actor_rollout_ref.embodied.env.action_order``) and/or negated
(``env.action_signs``), so a VLA taught the environment's own action axes starts near zero
on the changed task; learning it shows the pipeline teaches something new. The other
control, a coin-flip reward, is the ``embodied`` reward manager's
(``reward_model.reward_kwargs.reward=coin_flip``)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from siirl.errors import ConfigError

ENV_KEY = "actor_rollout_ref.embodied.env"


def action_map(order: Sequence[int], signs: Sequence[float], action_dim: int
               ) -> Optional[Callable[[np.ndarray], np.ndarray]]:
    """``chunk [..., D] -> chunk`` as the environment receives it: its dimension ``i`` is
    the policy's dimension ``order[i]`` times ``signs[i]``; None when both are empty."""
    order, signs = list(order or ()), [float(s) for s in (signs or ())]
    if not order and not signs:
        return None
    if order and sorted(int(i) for i in order) != list(range(action_dim)):
        raise ConfigError(f"{ENV_KEY}.action_order={order} must be a permutation of the "
                          f"environment's {action_dim} action dimensions, e.g. "
                          f"{list(reversed(range(action_dim)))} ([] leaves them)")
    if signs and (len(signs) != action_dim or any(s not in (-1.0, 1.0) for s in signs)):
        raise ConfigError(f"{ENV_KEY}.action_signs={signs} must give 1 or -1 for each of the "
                          f"environment's {action_dim} action dimensions, e.g. "
                          f"{[-1] + [1] * (action_dim - 1)} ([] leaves them)")
    index = np.array([int(i) for i in order] or range(action_dim))
    scale = np.array(signs or [1.0] * action_dim, dtype=np.float32)
    return lambda chunk: chunk[..., index] * scale


def env_action_map(config: Any, action_dim: int
                   ) -> Optional[Callable[[np.ndarray], np.ndarray]]:
    env = config.actor_rollout_ref.embodied.env
    return action_map(env.action_order or (), env.action_signs or (), action_dim)
