"""The key rules of ``algorithm.rollout_correction``: refused where the rollout reports no
log-probs or the loss cannot take the weights or bypass mode's loss; the keys that act only
with another one are notices without it."""

import pytest
from omegaconf import OmegaConf

from siirl.params import SiiRLArguments
from siirl.params.key_rule_kinds import NOT_APPLYING, REFUSED
from siirl.params.key_support import rule_for

RC = "algorithm.rollout_correction"
LOSS = "actor_rollout_ref.actor.policy_loss.loss_mode"


def _kind(key, **settings):
    config = OmegaConf.structured(SiiRLArguments)
    for dotted, value in settings.items():
        OmegaConf.update(config, dotted.replace("__", "."), value, merge=False)
    rule = rule_for(key, config)
    return rule.kind if rule is not None else "read"


def _set(**values):
    return {k.replace(".", "__"): v for k, v in values.items()}


@pytest.mark.parametrize("loss,kind", [("vanilla", "read"), ("gspo", "read"), ("gpg", "read"),
                                       ("clip_cov", REFUSED), ("kl_cov", REFUSED),
                                       ("geo_mean", REFUSED)])
def test_decoupled_weights_need_a_loss_linear_in_the_advantage(loss, kind):
    assert _kind(f"{RC}.rollout_is", **_set(**{f"{RC}.rollout_is": "token", LOSS: loss})) == kind


def test_bypass_mode_runs_the_vanilla_loss_only():
    settings = {f"{RC}.bypass_mode": True, f"{RC}.rollout_is": "token"}
    assert _kind(f"{RC}.bypass_mode", **_set(**settings)) == "read"
    assert _kind(f"{RC}.bypass_mode", **_set(**settings, **{LOSS: "gspo"})) == REFUSED
    # the weights go to bypass mode's own loss there, whatever loss_mode says
    assert _kind(f"{RC}.rollout_is", **_set(**settings, **{LOSS: "geo_mean"})) == "read"
    assert _kind(f"{RC}.bypass_mode", **_set(
        **settings, **{"actor_rollout_ref.actor.use_cpgd_loss": True})) == REFUSED


@pytest.mark.parametrize("setting", [{"actor_rollout_ref.rollout.multi_turn.enable": True},
                                     {"algorithm.workflow_type": "EMBODIED"},
                                     {"algorithm.workflow_type": "AGENTIC"}])
def test_refused_where_the_rollout_reports_no_log_probs(setting):
    for key, value in ((f"{RC}.rollout_is", "token"), (f"{RC}.rollout_rs", "token_k1"),
                       (f"{RC}.bypass_mode", True)):
        assert _kind(key, **_set(**setting, **{key: value})) == REFUSED, key
        assert _kind(key, **_set(**{key: value})) == "read", key


def test_keys_that_act_only_with_another_one():
    assert _kind(f"{RC}.loss_type", **_set(**{f"{RC}.loss_type": "reinforce"})) == NOT_APPLYING
    assert _kind(f"{RC}.loss_type", **_set(**{f"{RC}.loss_type": "reinforce",
                                               f"{RC}.bypass_mode": True})) == "read"
    assert _kind(f"{RC}.rollout_is_threshold", **_set(**{f"{RC}.rollout_is_threshold": 3.0})) \
        == NOT_APPLYING
    assert _kind(f"{RC}.rollout_is_threshold", **_set(**{f"{RC}.rollout_is_threshold": 3.0,
                                                          f"{RC}.rollout_is": "sequence"})) \
        == "read"
    assert _kind(f"{RC}.rollout_rs_threshold", **_set(**{f"{RC}.rollout_rs_threshold": 0.1})) \
        == NOT_APPLYING
