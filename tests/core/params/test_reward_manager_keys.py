"""verl's top-level ``reward_manager`` section (``source``, ``name``, ``module.path``,
``module.name``): every key is known here, read or named with the reason it does not
apply; ``reward_manager.name`` is ``reward_model.reward_manager``'s newer spelling."""

import json
from pathlib import Path

import pytest

from siirl.errors import ConfigError
from siirl.params.key_support import leaf_defaults, rule_for
from siirl.params.parser import parse_config

ROOT = Path(__file__).resolve().parents[3]
IMPORTLIB = ["reward_manager.source=importlib", "reward_manager.name=MyManager",
             "reward_manager.module.path=my_manager.py"]


def test_every_key_of_verls_reward_manager_section_is_known_with_verls_defaults():
    verl = json.loads((ROOT / "docs/verl_defaults.json").read_text())["defaults"]
    section = {k: v for k, v in verl.items() if k.startswith("reward_manager.")}
    assert sorted(section) == ["reward_manager.module.name", "reward_manager.module.path",
                               "reward_manager.name", "reward_manager.source"]
    ours = leaf_defaults()
    for key in ("reward_manager.module.name", "reward_manager.module.path",
                "reward_manager.source"):
        assert ours[key] == section[key], key
    # verl: ${oc.select:reward_model.reward_manager,naive}; both follow the older key
    assert ours["reward_manager.name"] == "${reward_model.reward_manager}"


def test_defaults_are_read_silently(capsys):
    config = parse_config([], validate=True)
    assert config.reward_manager.name == config.reward_model.reward_manager == "naive"
    assert capsys.readouterr().err == ""
    assert all(rule_for(k, config) is None for k in ("reward_manager.source",
                                                      "reward_manager.name"))


@pytest.mark.parametrize("overrides", [["reward_manager.name=dapo"],
                                       ["reward_manager.name=dapo",
                                        "reward_model.reward_manager=dapo"],
                                       ["reward_model.reward_manager=dapo"]])
def test_name_is_the_older_keys_choice(overrides, capsys):
    config = parse_config(overrides, validate=True)
    assert config.reward_model.reward_manager == config.reward_manager.name == "dapo"
    assert capsys.readouterr().err == ""


def test_importlib_makes_the_class_the_reward_manager(capsys):
    config = parse_config(IMPORTLIB + ["reward_manager.module.name=my_mod"], validate=True)
    assert config.reward_model.reward_manager == "MyManager"
    assert capsys.readouterr().err == ""  # module.path and module.name are read


@pytest.mark.parametrize("overrides,words", [
    (["reward_manager.name=dapo", "reward_model.reward_manager=batch"],
     ["reward_manager.name='dapo'", "reward_model.reward_manager='batch'", "two reward"]),
    (IMPORTLIB + ["reward_model.reward_manager=batch"], ["'MyManager'", "'batch'",
                                                         "class to load"]),
    (["reward_manager.source=importlib"], ["needs reward_manager.name",
                                           "needs reward_manager.module.path"]),
    (["reward_manager.source=importlib", "reward_manager.name=X"],
     ["needs reward_manager.module.path"]),
])
def test_conflicts_and_missing_parts_stop_the_parse(overrides, words):
    with pytest.raises(ConfigError) as info:
        parse_config(overrides)
    assert all(word in str(info.value) for word in words), str(info.value)


def test_an_unknown_source_is_refused_by_the_validation_pass():
    with pytest.raises(ConfigError, match="reward_manager.source='remote': must be one of: "
                                          "register, importlib"):
        parse_config(["reward_manager.source=remote"], validate=True)


@pytest.mark.parametrize("overrides,words", [
    (["reward_manager.module.path=my_manager.py", "reward_manager.module.name=m"],
     ["reward_manager.module.path='my_manager.py'", "reward_manager.module.name='m'",
      "source=importlib"]),
    (IMPORTLIB[:2] + ["reward_manager.module.path=pkg://my_pkg.managers",
                      "reward_manager.module.name=m"],
     ["reward_manager.module.name='m'", "pkg://"]),
])
def test_module_keys_that_do_not_apply_say_why(overrides, words, capsys):
    parse_config(overrides, validate=True)
    err = capsys.readouterr().err
    assert all(word in err for word in words), err


def test_the_reward_loop_refusal_points_at_the_section_that_loads_a_class():
    with pytest.raises(ConfigError) as info:
        parse_config(["reward_model.reward_loop_source=importlib"], validate=True)
    assert "reward_manager.source=importlib" in str(info.value)
    parse_config(IMPORTLIB, validate=True)  # which is itself accepted
