"""The registries of the algorithm pieces a config key chooses by name: advantage
estimators, CPGD weight factors, loss aggregation modes, policy losses, KL estimators and
KL controllers.

This module is the one list of the built-in names. Each maps to the function that
implements it as a ``"module:attribute"`` reference, like a Python entry point, so the
names are read here without importing torch: ``siirl-train``'s validation pass lists and
checks them before anything heavy loads (``siirl.params.value_rules``), and the module is
imported when a name is first looked up. User code adds names with the ``register_*``
decorators (``register_adv_est``, ``register_policy_loss``...); a name registered so is
valid in the validation pass of the same process too.
"""

from __future__ import annotations

from siirl.dag_worker.core_algos.name_registry import NameRegistry

_ADV = "siirl.dag_worker.core_algos.advantages"
_AGG = "siirl.dag_worker.core_algos.loss_aggregation"
_LOSSES = "siirl.dag_worker.core_algos.policy_losses"
_KL = "siirl.dag_worker.core_algos.kl"

ADV_ESTIMATORS = NameRegistry("algorithm.adv_estimator", "advantage estimator", {
    "grpo": f"{_ADV}:compute_grpo_outcome_advantage",
    "gspo": f"{_ADV}:compute_grpo_outcome_advantage",
    "drgrpo": f"{_ADV}:compute_drgrpo_outcome_advantage",
    "cpgd": f"{_ADV}:compute_cpgd_outcome_advantage",
    "rloo": f"{_ADV}:compute_rloo_outcome_advantage",
    "reinforce_plus_plus_baseline":
        f"{_ADV}:compute_reinforce_plus_plus_baseline_outcome_advantage",
    "opo": f"{_ADV}:compute_opo_outcome_advantage",
    "grpo_passk": f"{_ADV}:compute_grpo_passk_outcome_advantage",
    "gpg": f"{_ADV}:compute_gpg_outcome_advantage",
    "remax": f"{_ADV}:compute_remax_outcome_advantage",
    "gae": f"{_ADV}:compute_gae_advantage_return",
    "gae_marft": f"{_ADV}:compute_marft_gae_advantage_return",
    "reinforce_plus_plus": f"{_ADV}:compute_reinforce_plus_plus_outcome_advantage",
})

# fn(centred, std, epsilon, batch_size, spread_groups) -> advantage
CPGD_WEIGHTS = NameRegistry("algorithm.weight_factor_in_cpgd", "CPGD weight factor", {
    "STD_weight": f"{_ADV}:cpgd_std_weight",
    "clip_filter_like_weight": f"{_ADV}:cpgd_clip_filter_like_weight",
    "naive": f"{_ADV}:cpgd_naive",
})

# (reduce(loss_mat, mask) -> scalar, units(mask) -> count or None for a sum)
AGG_MODES = NameRegistry("loss_agg_mode", "loss aggregation mode", {
    "token-mean": f"{_AGG}:TOKEN_MEAN",
    "seq-mean-token-sum": f"{_AGG}:SEQ_MEAN_TOKEN_SUM",
    "seq-mean-token-mean": f"{_AGG}:SEQ_MEAN_TOKEN_MEAN",
    "seq-mean-token-sum-norm": f"{_AGG}:SEQ_MEAN_TOKEN_SUM_NORM",
})

POLICY_LOSSES = NameRegistry("actor_rollout_ref.actor.policy_loss.loss_mode", "policy loss", {
    name: f"{_LOSSES}:compute_policy_loss_{name}"
    for name in ("vanilla", "gspo", "cpgd", "gpg", "clip_cov", "kl_cov", "geo_mean")
})

KL_ESTIMATORS = NameRegistry("kl penalty", "KL estimator", {
    "kl": f"{_KL}:kl_k1", "k1": f"{_KL}:kl_k1",
    "abs": f"{_KL}:kl_abs",
    "mse": f"{_KL}:kl_k2", "k2": f"{_KL}:kl_k2",
    "low_var_kl": f"{_KL}:kl_k3", "k3": f"{_KL}:kl_k3",
    "full": f"{_KL}:kl_full",
})

# fn(algorithm.kl_ctrl) -> controller
KL_CONTROLLERS = NameRegistry("algorithm.kl_ctrl.type", "KL controller", {
    "fixed": f"{_KL}:fixed_controller",
    "adaptive": f"{_KL}:adaptive_controller",
})
