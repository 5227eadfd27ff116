"""KL estimators, KL-coefficient controllers and the in-reward KL penalty.

Per-token estimators of KL(actor || ref) from the sampled token's log-probs, with
d = logprob - ref_logprob (Schulman, "Approximating KL divergence"):

- ``kl`` / ``k1``: d
- ``abs``: |d|
- ``mse`` / ``k2``: d^2 / 2
- ``low_var_kl`` / ``k3``: exp(-d) + d - 1, with -d clamped to [-20, 20] and the result
  to [-10, 10] (verl's guards against one diverged token)
- ``full``: needs full-vocabulary distributions, which this interface does not carry
  (raises ConfigError)

A trailing ``+`` (``k1+``, ``k3+``, ``low_var_kl+``, ...) is the straight-through
variant: the forward value of that estimator with the gradient of k2, d * grad(d), an
unbiased estimate of the gradient of KL (the gradients of k1 and k3 are biased).

Controllers (``algorithm.kl_ctrl.type``) hold the in-reward KL coefficient ``value``:
``fixed`` never changes it; ``adaptive`` (Ziegler et al. 2019) multiplies it after each
batch by 1 + clip(current_kl / target_kl - 1, -0.2, 0.2) * n_steps / horizon.

``apply_kl_penalty`` (``algorithm.use_kl_in_reward``) turns scores into rewards:
token_level_rewards = token_level_scores - beta * kl_penalty(old, ref) * response_mask.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

from siirl.dag_worker.core_algos.common import masked_mean
from siirl.dag_worker.core_algos.names import KL_CONTROLLERS as _KL_CONTROLLERS
from siirl.dag_worker.core_algos.names import KL_ESTIMATORS as _KL_ESTIMATORS
from siirl.data_coordinator.fields import (
    OLD_LOG_PROBS,
    REF_LOG_PROB,
    RESPONSE_MASK,
    TOKEN_LEVEL_REWARDS,
    TOKEN_LEVEL_SCORES,
)
from siirl.errors import ConfigError, DataError
from siirl.params import KLCtrlArguments
from siirl.params.typed import to_section

# ---- estimators (named in core_algos.names) ------------------------------------------


def register_kl_estimator(*names: str):
    return _KL_ESTIMATORS.register(*names)


def registered_kl_estimators() -> list:
    return _KL_ESTIMATORS.names()


def kl_k1(logprob, ref_logprob):
    return logprob - ref_logprob


def kl_abs(logprob, ref_logprob):
    return (logprob - ref_logprob).abs()


def kl_k2(logprob, ref_logprob):
    return 0.5 * (logprob - ref_logprob).square()


def kl_k3(logprob, ref_logprob):
    # Schulman's k3 = r - log r - 1 with r = ref/actor; clamps as in verl keep one
    # diverged token from producing inf/nan.
    kl = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(kl) - kl - 1.0, min=-10.0, max=10.0)


def kl_full(logprob, ref_logprob):
    raise ConfigError("kl penalty 'full' needs full-vocabulary log-probs of both policies; "
                      "only per-token log-probs are available here: use kl, abs, mse, "
                      "low_var_kl (or their k1/k2/k3 names, optionally with a '+' suffix)")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor,
               kl_penalty: str) -> torch.Tensor:
    """Per-token KL(actor || ref) estimate.

    A trailing ``+`` (e.g. ``k3+``) gives the value of that estimator with the gradient of
    k2, which is an unbiased gradient of KL (the k1/k3 gradients are biased).
    """
    straight_through = kl_penalty.endswith("+")
    name = kl_penalty[:-1] if straight_through else kl_penalty
    estimator = _KL_ESTIMATORS.get(name, hint=" (each also with a '+' suffix)")
    value = estimator(logprob, ref_logprob)
    if not straight_through:
        return value
    k2 = kl_k2(logprob, ref_logprob)
    return k2 - k2.detach() + value.detach()


_estimate_kl = kl_penalty  # apply_kl_penalty's argument of the same name shadows it


# ---- controllers ---------------------------------------------------------------------

class FixedKLController:
    """A constant KL coefficient ``value``."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: Any, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> Dict[str, Any]:
        return {"type": "fixed", "value": self.value}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        # The saved value wins over the config's kl_coef, so a resumed run continues
        # with exactly the coefficient it had.
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al., arXiv 1909.08593), verl's update rule."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if not target_kl > 0:
            raise ConfigError(f"algorithm.kl_ctrl.target_kl must be > 0, got {target_kl}")
        if not horizon > 0:
            raise ConfigError(f"algorithm.kl_ctrl.horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: Any, n_steps: int) -> None:
        """value *= 1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon."""
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> Dict[str, Any]:
        return {"type": "adaptive", "value": self.value, "target_kl": self.target,
                "horizon": self.horizon}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        # Only the coefficient is state; target_kl and horizon come from the config.
        self.value = float(state["value"])


# the controllers by algorithm.kl_ctrl.type (named in core_algos.names)
def fixed_controller(kl_ctrl_config: Any) -> FixedKLController:
    return FixedKLController(kl_coef=kl_ctrl_config.kl_coef)


def adaptive_controller(kl_ctrl_config: Any) -> AdaptiveKLController:
    return AdaptiveKLController(init_kl_coef=kl_ctrl_config.kl_coef,
                                target_kl=kl_ctrl_config.target_kl,
                                horizon=kl_ctrl_config.horizon)


def get_kl_controller(kl_ctrl_config: Any):
    """The controller ``algorithm.kl_ctrl`` describes (type fixed|adaptive, kl_coef,
    target_kl, horizon; defaults as in the config schema)."""
    kl_ctrl_config = to_section(KLCtrlArguments, kl_ctrl_config)  # typed in a run
    return _KL_CONTROLLERS.get(kl_ctrl_config.type)(kl_ctrl_config)


def registered_kl_controllers() -> list:
    return _KL_CONTROLLERS.names()


# ---- in-reward KL penalty ------------------------------------------------------------

_PENALTY_KEYS = (TOKEN_LEVEL_SCORES, OLD_LOG_PROBS, REF_LOG_PROB, RESPONSE_MASK)


def apply_kl_penalty(batch: Any, kl_ctrl: Any, kl_penalty: str = "kl") -> Tuple[Any, dict]:
    """Set ``batch["token_level_rewards"] = token_level_scores - beta * kld`` (verl).

    kld = kl_penalty(old_log_probs, ref_log_prob) * response_mask and beta is the
    controller's value before this batch's update. current_kl is the mean over all rows
    of each row's masked-mean kld (an empty row counts as 0, as in verl); the controller
    is then updated with (current_kl, n_steps=batch size). Returns the batch (modified in
    place) and {"actor/reward_kl_penalty": current_kl,
    "actor/reward_kl_penalty_coeff": beta}.
    """
    missing = [key for key in _PENALTY_KEYS if key not in batch.keys()]
    if missing:
        raise DataError(f"apply_kl_penalty needs {', '.join(missing)} in the batch "
                        f"(algorithm.use_kl_in_reward needs a reference policy)")
    scores = batch[TOKEN_LEVEL_SCORES]
    mask = batch[RESPONSE_MASK].to(scores.dtype)
    with torch.no_grad():
        kld = _estimate_kl(batch[OLD_LOG_PROBS], batch[REF_LOG_PROB], kl_penalty) * mask
    beta = kl_ctrl.value
    batch[TOKEN_LEVEL_REWARDS] = scores - beta * kld
    current_kl = masked_mean(kld, mask, axis=-1).mean(dim=0).item()
    kl_ctrl.update(current_kl=current_kl, n_steps=scores.shape[0])
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
    return batch, metrics
