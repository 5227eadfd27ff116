"""siirl-envs' multi_turn and custom_envs config sections: registered under siirl.config,
mounted where verl and ROLL put them, with the multi-turn keys' rules and ranges."""

from __future__ import annotations

import pytest

from siirl.environment.config import agentic, multi_turn
from siirl.params.key_support import rule_for
from siirl.params.parser import parse_config
from siirl.params.sections import installed_sections, mounted_at
from siirl.params.typed import to_typed
from siirl.params.validation import value_problems

KEY = "actor_rollout_ref.rollout.multi_turn"


def _typed(*overrides: str):
    return to_typed(parse_config(list(overrides), check_support=False))


def test_both_sections_are_registered_where_they_mount():
    assert installed_sections()["multi_turn"] is multi_turn.SECTION
    assert installed_sections()["custom_envs"] is agentic.CUSTOM_ENVS
    assert mounted_at(KEY) is multi_turn.SECTION and mounted_at("custom_envs") is \
        agentic.CUSTOM_ENVS
    config = _typed("+custom_envs.Lake.env_type=frozen_lake")
    assert isinstance(config.actor_rollout_ref.rollout.multi_turn,
                      multi_turn.MultiTurnArguments)
    assert config.custom_envs == {"Lake": {"env_type": "frozen_lake"}}


@pytest.mark.parametrize("overrides, key, tag", [
    ([f"{KEY}.max_turns=3"], f"{KEY}.max_turns", "no effect: a conversation is one token list"),
    ([f"{KEY}.format=x"], f"{KEY}.format", "no effect: multi-turn is off"),
    ([f"{KEY}.max_assistant_turns=2"], f"{KEY}.max_assistant_turns",
     "no effect: multi-turn is off"),
    ([f"{KEY}.enable=true", f"{KEY}.format=x"], f"{KEY}.format", None),
    # a multi-agent workflow file reads the turn bound without enable
    ([f"{KEY}.max_assistant_turns=2", "dag.workflow_path=marft.yaml"],
     f"{KEY}.max_assistant_turns", None),
])
def test_the_rules_of_the_multi_turn_keys(overrides, key, tag):
    rule = rule_for(key, _typed(*overrides))
    assert (rule.tag if rule else None) == tag


def test_the_ranges_of_the_multi_turn_keys():
    problems = value_problems(_typed(f"{KEY}.max_parallel_calls=0",
                                     f"{KEY}.max_user_turns=0", f"{KEY}.max_assistant_turns=3"))
    assert problems == [f"{KEY}.max_user_turns=0: must be at least 1 (or null)",
                        f"{KEY}.max_parallel_calls=0: must be at least 1"]
