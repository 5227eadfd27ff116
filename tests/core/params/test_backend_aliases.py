"""verl's ``strategy=fsdp2`` (its FSDP2; its ``fsdp`` is FSDP1) selects siiRL's fsdp backend,
which is FSDP2: the fsdp section declares the alias (its ``"aliases"`` name table) and the
configuration writes it as ``fsdp`` once, when composed (siirl.params.aliases), so the engine
lookup, the sections' selectors, their notices and the planner all read one name."""

from operator import attrgetter

import pytest

from siirl.params.aliases import backend_aliases
from siirl.params.key_support import check_key_support
from siirl.params.parser import parse_config
from siirl.params.sections import installed_sections, section_selected_by
from siirl.params.typed import to_typed
from siirl.plugins import available

ACTOR, REF = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
STRATEGY_KEYS = (f"{ACTOR}.strategy", f"{REF}.strategy", "critic.strategy",
                 "reward_model.strategy")
FSDP_KEYS = [f"{ACTOR}.fsdp_config.fsdp_size=1", "critic.model.fsdp_config.fsdp_size=1"]


def _strategies(cfg):
    return [str(attrgetter(key)(cfg)) for key in STRATEGY_KEYS]


def _typed(strategy, *extra, keys=STRATEGY_KEYS):
    cfg = parse_config([f"{key}={strategy}" for key in keys] +
                       ["algorithm.adv_estimator=gae", *extra], check_support=False)
    return cfg, to_typed(cfg)


def test_every_key_naming_a_training_backend_takes_fsdp2_as_fsdp():
    cfg, args = _typed("fsdp2")
    assert _strategies(cfg) == ["fsdp"] * 4  # what --print-config shows
    assert _strategies(args) == ["fsdp"] * 4  # what every reader gets
    # the reference follows the actor's strategy by its default interpolation
    cfg, _ = _typed("fsdp2", keys=(f"{ACTOR}.strategy",))
    assert (cfg.actor_rollout_ref.actor.strategy, cfg.actor_rollout_ref.ref.strategy) == (
        "fsdp", "fsdp")


def test_the_keys_an_alias_is_written_at_come_from_the_sections_and_the_schema():
    at = backend_aliases()
    assert sorted(at) == sorted(STRATEGY_KEYS)
    assert all(aliases == {"fsdp2": "fsdp"} for aliases in at.values())
    # each alias stands for an installed training backend
    assert {name for aliases in at.values() for name in aliases.values()} <= set(
        available("siirl.engines"))


@pytest.mark.parametrize("strategy", ["megatron", "fsdp3"])
def test_other_names_stay_as_written(strategy):
    cfg, _ = _typed(strategy, keys=(f"{ACTOR}.strategy", "critic.strategy"))
    assert (cfg.actor_rollout_ref.actor.strategy, cfg.critic.strategy) == (strategy, strategy)


@pytest.mark.parametrize("selector", [f"{ACTOR}.strategy", f"{REF}.strategy",
                                      "critic.strategy"])
def test_fsdp2_selects_the_fsdp_section(selector):
    fsdp = installed_sections()["fsdp"]
    assert section_selected_by(selector, _typed("fsdp2")[1]) is fsdp
    assert section_selected_by(selector, _typed("megatron")[1]) is not fsdp


def test_fsdp_settings_apply_under_fsdp2_as_under_fsdp():
    # with megatron the FSDP keys do not apply (one notice each); fsdp2 is fsdp: none
    assert check_key_support(_typed("fsdp2", *FSDP_KEYS)[1]) == \
        check_key_support(_typed("fsdp", *FSDP_KEYS)[1]) == []
    notices = check_key_support(_typed("megatron", *FSDP_KEYS,
                                       keys=(f"{ACTOR}.strategy", "critic.strategy"))[1])
    assert any("FSDP settings apply only when critic.strategy=fsdp" in n for n in notices)


def test_a_config_given_as_a_mapping_is_written_the_same_way():
    args = to_typed({"actor_rollout_ref": {"actor": {"strategy": "fsdp2"}},
                     "critic": {"strategy": "fsdp2"}, "reward_model": {"strategy": "fsdp2"}})
    assert _strategies(args) == ["fsdp"] * 4
