"""The key rules of ``algorithm.rollout_correction`` (their place in ``key_rules.RULES`` is
under the algorithm keys): where the rollout reports no log-probs, the loss cannot take the
weights or bypass mode's loss, and the keys that act only with another one set."""

from __future__ import annotations

from typing import Any, Tuple

from siirl.params.key_conditions import ACTOR, ROLLOUT, custom_workflow, get
from siirl.params.key_rule_kinds import Rule, notice, refused
from siirl.params.rollout_correction import KEY, WEIGHTED_LOSSES

_SWITCHES = (f"{KEY}.rollout_is", f"{KEY}.rollout_rs", f"{KEY}.bypass_mode")


def _policy_loss(config: Any) -> str:
    """The policy loss the actor runs (CPGD's flag overrides loss_mode, as in the actor)."""
    if get(config, f"{ACTOR}.use_cpgd_loss"):
        return "cpgd"
    return str(get(config, f"{ACTOR}.policy_loss.loss_mode", "vanilla"))


def _no_rollout_log_probs(config: Any, key: str) -> bool:
    """The rollouts of multi-turn, agentic and embodied episodes report no log-probs of
    their own (the hf, vllm and sglang rollouts do)."""
    episodes = not custom_workflow(config) and str(
        get(config, "algorithm.workflow_type", "DEFAULT")).upper() in ("EMBODIED", "AGENTIC")
    multi_turn = bool(get(config, f"{ROLLOUT}.multi_turn.enable"))
    return bool(get(config, key)) and (episodes or multi_turn)


def _weights_on_other_loss(config: Any, key: str) -> bool:
    return get(config, key) is not None and not get(config, f"{KEY}.bypass_mode") and \
        _policy_loss(config) not in WEIGHTED_LOSSES


def _bypass_on_other_loss(config: Any, key: str) -> bool:
    return bool(get(config, key)) and _policy_loss(config) != "vanilla"


RULES: Tuple[Rule, ...] = (
    refused(_SWITCHES, "the rollout reports no log-probs",
            "rollout correction compares the trainer's log-probs with those of the policy "
            "that sampled (rollout_log_probs), which the multi-turn, agentic and embodied "
            "rollouts do not report; the hf, vllm and sglang rollouts of the DEFAULT and "
            "DAPO workflows do.", _no_rollout_log_probs),
    refused(f"{KEY}.rollout_is", "weights need a loss linear in the advantage",
            "decoupled mode multiplies each token's loss by its importance weight, which "
            "siiRL applies through the advantage: exact for the policy losses "
            f"{', '.join(WEIGHTED_LOSSES)} (actor.policy_loss.loss_mode), whose token loss "
            "scales with a positive factor on the advantage; clip_cov, kl_cov and geo_mean "
            "select or average tokens by the advantage itself. Use one of those losses, or "
            "bypass_mode=true with loss_type=reinforce.", _weights_on_other_loss),
    refused(f"{KEY}.bypass_mode", "bypass mode runs the vanilla PPO loss",
            "bypass mode replaces the policy loss, as in verl (loss_type=ppo_clip: the "
            "vanilla PPO loss against the rollout's log-probs; reinforce: -w A log pi), so "
            "another actor.policy_loss.loss_mode (or use_cpgd_loss) would be ignored: keep "
            "loss_mode=vanilla.", _bypass_on_other_loss),
    notice(f"{KEY}.loss_type", "no effect without bypass_mode",
           "loss_type chooses bypass mode's loss (algorithm.rollout_correction.bypass_mode="
           "true); decoupled mode weights the actor's own policy loss.",
           lambda config, key: not get(config, f"{KEY}.bypass_mode")),
    notice((f"{KEY}.rollout_is_threshold", f"{KEY}.rollout_is_batch_normalize"),
           "no effect without rollout_is",
           "they shape the importance weights, which algorithm.rollout_correction.rollout_is "
           "(token or sequence) turns on.",
           lambda config, key: get(config, f"{KEY}.rollout_is") is None),
    notice(f"{KEY}.rollout_rs_threshold", "no effect without rollout_rs",
           "the bounds belong to the rejection criteria of "
           "algorithm.rollout_correction.rollout_rs.",
           lambda config, key: get(config, f"{KEY}.rollout_rs") is None),
)
