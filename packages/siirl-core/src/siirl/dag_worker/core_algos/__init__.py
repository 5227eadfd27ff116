"""RL algorithm math: advantage estimators, loss aggregation, policy losses, value loss,
KL estimators and controllers, entropy; each choosable piece registered by name.

Modules:

- ``names``: the registries and the one list of built-in names (estimators, CPGD weights,
  loss aggregation modes, policy losses, KL estimators and controllers), readable without
  importing torch.
- ``advantages``: ``register_adv_est`` / ``get_adv_estimator_fn`` and the estimators.
- ``loss_aggregation``: ``agg_loss`` / ``agg_loss_units`` (loss_agg_mode),
  ``register_agg_mode``.
- ``policy_losses``: ``register_policy_loss`` / ``get_policy_loss_fn`` and the policy
  losses, entropy.
- ``value``: ``compute_value_loss`` (clipped critic loss).
- ``kl``: ``kl_penalty`` estimators, ``FixedKLController`` / ``AdaptiveKLController`` /
  ``get_kl_controller``, ``apply_kl_penalty``.
- ``rollout_correction``: verl's rollout correction (importance weights, rejection of
  tokens or sequences, bypass mode's REINFORCE loss); its metrics in
  ``rollout_correction_metrics``.
- ``common``: masked statistics and prompt grouping.
- ``batch_reduction``: sums over every worker's rows for the statistics that span the
  batch (``LOCAL``: this process's rows are the whole batch).

Unknown names raise ConfigError listing the registered ones. Each module's docstring
gives its formulas.
"""

import importlib
from typing import Any

# Loaded on first use (PEP 562): ``core_algos.names`` (the registries' names) is read by
# siirl-train's validation pass, which must not import torch through this package.
_SUBMODULES = ("advantages", "common", "kl", "loss_aggregation", "policy_losses", "value",
               "rollout_correction", "names")

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "ROLLOUT_IS_WEIGHTS",
    "agg_loss",
    "agg_loss_units",
    "apply_kl_penalty",
    "compute_cpgd_outcome_advantage",
    "compute_drgrpo_outcome_advantage",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_cpgd",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_value_loss",
    "correct_rollout",
    "entropy_from_logits",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "group_rows",
    "kl_penalty",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "register_adv_est",
    "register_agg_mode",
    "register_kl_estimator",
    "register_policy_loss",
    "reinforce_loss",
    "tis_weights",
    "registered_adv_estimators",
    "registered_agg_modes",
    "registered_kl_controllers",
    "registered_kl_estimators",
    "registered_policy_losses",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in __all__:
        for submodule in _SUBMODULES:
            module = importlib.import_module(f"{__name__}.{submodule}")
            if hasattr(module, name):
                value = globals()[name] = getattr(module, name)
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
