"""No configuration key is silently ignored: each leaf of the schema is read by some code, or
the table in siirl/params/key_rules.py reports it as not applying or refuses it."""

import copy
import dataclasses
import fnmatch
import json
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from siirl_config_reads import names_exactly, read_keys

from siirl import main_dag
from siirl.errors import ConfigError
from siirl.params import SiiRLArguments
from siirl.params.help import format_help
from siirl.params.key_rules import always
from siirl.params.key_support import (
    NOT_APPLYING,
    REFUSED,
    RULES,
    check_key_support,
    leaf_defaults,
    rule_for,
)
from siirl.params.parser import parse_config, schema_paths

REPO = Path(__file__).resolve().parents[3]
LEAVES = leaf_defaults()
MEGATRON = ["actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron"]
# the contexts whose refused / not-applying keys are exercised one by one
CONTEXTS = {"defaults": [], "megatron": MEGATRON}


def _rules_matching(key):
    return [r for r in RULES if any(fnmatch.fnmatchcase(key, p) for p in r.patterns)]


def test_leaves_are_the_schema_keys_without_groups():
    groups = {p.rsplit(".", 1)[0] for p in schema_paths() if "." in p}
    assert set(LEAVES) == set(schema_paths()) - groups
    assert len(LEAVES) > 300


def test_every_rule_pattern_matches_a_schema_key():
    for rule in RULES:
        for pattern in rule.patterns:
            assert fnmatch.filter(LEAVES, pattern), pattern


def test_every_key_is_read_or_in_the_table():
    untabled = [k for k in LEAVES if not _rules_matching(k)]
    read = read_keys(untabled, LEAVES)
    # a key listed here is accepted and ignored: make some code read it, or add it to the
    # table in siirl/params/key_rules.py as not applying or refused
    assert sorted(set(untabled) - read) == []
    assert len(untabled) > 100  # the static scan finds what the engines read


def test_keys_the_table_always_ignores_are_not_read():
    # a key whose first rule holds unconditionally must not be named by any code
    for key in LEAVES:
        rules = _rules_matching(key)
        if rules and rules[0].when is always:
            assert names_exactly(key) == [], f"{key} is read, but the table ignores it"


def test_weight_factor_in_cpgd_is_declared_once():
    from siirl.params import training_args

    assert Path(training_args.__file__).read_text().count("weight_factor_in_cpgd:") == 1


def _field(key):
    node = SiiRLArguments()
    *groups, leaf = key.split(".")
    for g in groups:
        node = getattr(node, g)
    return next(f for f in dataclasses.fields(node) if f.name == leaf)


def _other_value(key, current):
    """A value for ``key`` different from ``current`` (its value in the context)."""
    if isinstance(current, bool):
        return not current
    if isinstance(current, (int, float)):
        return current + (1 if isinstance(current, int) else 0.5)
    if isinstance(current, str):
        return current + "_x"
    if isinstance(current, list):
        return ["x"]
    if isinstance(current, dict):
        return {"siirl_test": 1}
    kind = str(_field(key).type)
    return next((v for name, v in (("bool", True), ("int", 2), ("float", 0.5)) if name in kind),
                "x")


def _base(context):
    """The context's configuration, unresolved, so keys that follow another by interpolation
    follow it when a test sets that one."""
    config = OmegaConf.structured(SiiRLArguments)
    for text in CONTEXTS[context]:
        OmegaConf.update(config, *text.split("=", 1))
    return config


def _with(base, key):
    """``base`` with ``key`` set away from its value there."""
    config = copy.deepcopy(base)
    value = OmegaConf.select(config, key)
    value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    OmegaConf.update(config, key, _other_value(key, value), merge=False)
    return config


def _keys_of(kind, base):
    return [k for k in LEAVES if (r := rule_for(k, base)) and r.kind == kind]


@pytest.mark.parametrize("context", sorted(CONTEXTS))
def test_a_refused_key_stops_the_run_naming_it(context):
    base = _base(context)
    refused = _keys_of(REFUSED, base)
    assert refused
    for key in refused:
        with pytest.raises(ConfigError) as info:
            check_key_support(OmegaConf.to_object(_with(base, key)))
        assert key in str(info.value)
    # through the parser, as siirl-train and main() get it
    with pytest.raises(ConfigError, match=re.escape(refused[0])):
        parse_config(CONTEXTS[context] + [_override(base, refused[0])])


@pytest.mark.parametrize("context", sorted(CONTEXTS))
def test_a_not_applying_key_gives_a_notice_naming_it(context, capsys):
    base = _base(context)
    keys = _keys_of(NOT_APPLYING, base)
    assert keys
    for key in keys:
        notices = check_key_support(OmegaConf.to_object(_with(base, key)))
        assert len(notices) == 1 and key in notices[0], (key, notices)
    capsys.readouterr()
    parse_config(CONTEXTS[context] + [_override(base, keys[0])])
    notices = capsys.readouterr().err.splitlines()
    assert len(notices) == 1 and keys[0] in notices[0]


def _override(base, key):
    """``key=value`` for the command line (a scalar key: JSON is valid Hydra there)."""
    return f"{key}={json.dumps(OmegaConf.select(_with(base, key), key))}"


def test_defaults_and_presets_pass_without_notices(capsys):
    presets = sorted((REPO / "configs").glob("*.yaml"))
    assert presets
    assert check_key_support(OmegaConf.to_object(parse_config([]))) == []
    for preset in presets:
        parse_config([], str(preset))
    assert capsys.readouterr().err == ""


def test_a_key_that_follows_another_by_interpolation_is_not_named():
    with pytest.raises(ConfigError) as info:
        parse_config(MEGATRON + ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"])
    message = str(info.value)
    assert "actor_rollout_ref.actor.ulysses_sequence_parallel_size" in message
    assert "ref.ulysses_sequence_parallel_size" not in message


def test_a_key_set_to_its_default_is_fine(capsys):
    parse_config(["actor_rollout_ref.model.lora_rank=0", "trainer.val_only=false",
                  "actor_rollout_ref.rollout.gpu_memory_utilization=0.5"])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("overrides,fine", [
    (["critic.enable=true", "algorithm.adv_estimator=gae"], True),  # PPO runs a critic
    (["critic.enable=false", "algorithm.adv_estimator=gae"], False),
    (["algorithm.filter_groups.enable=true", "algorithm.workflow_type=DAPO"], True),
    (["algorithm.filter_groups.enable=true"], True),  # verl's way: turns DAPO's sampling on
    (["algorithm.filter_groups.enable=true", "algorithm.adv_estimator=gae"], False),
    (["algorithm.filter_groups.enable=true", "algorithm.workflow_type=AGENTIC"], False),
    (["data.gen_batch_size=48"], False),  # read by dynamic sampling only
    (["actor_rollout_ref.actor.use_dynamic_bsz=true"], True),  # fsdp: token budgets
    (MEGATRON + ["actor_rollout_ref.actor.use_dynamic_bsz=true"], True),  # megatron too
    (MEGATRON + ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"], False),
    (["data.gen_batch_size=48", "algorithm.filter_groups.enable=true"], True),
    (MEGATRON + ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                 "critic.megatron.tensor_model_parallel_size=2"], True),  # same as actor's
    (MEGATRON + ["critic.megatron.tensor_model_parallel_size=2"], False),
    (["actor_rollout_ref.rollout.response_length=64"], False),
    (["data.max_response_length=64"], True),  # rollout.response_length follows it
])
def test_conditional_classes(overrides, fine):
    if fine:
        parse_config(overrides)
    else:
        with pytest.raises(ConfigError):
            parse_config(overrides)


def test_cli_refuses_with_exit_code_2(capsys):
    assert main_dag.main(["critic.model.lora_rank=8", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "critic.model.lora_rank=8" in err and "actor" in err


def test_cli_prints_a_notice_once(capsys):
    assert main_dag.main(["actor_rollout_ref.rollout.gpu_memory_utilization=0.9",
                          "--print-config"]) == 0
    err = capsys.readouterr().err
    assert err.count("gpu_memory_utilization") == 1 and "hf rollout" in err


def test_help_marks_keys_that_are_not_read():
    model = format_help("critic.model")
    assert "[refused: LoRA is built for the actor only]" in model
    lines = {line.split()[0]: line for line in format_help("actor_rollout_ref.rollout")
             .splitlines()[1:]}
    assert "[no effect with the hf rollout]" in lines["gpu_memory_utilization"]
    assert "[" not in lines["temperature"]  # read: no mark


def test_truncated_importance_sampling_needs_vllm_and_the_vanilla_loss():
    from siirl.errors import ConfigError
    from siirl.params.key_support import check_key_support

    tis = "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0"
    vllm = "actor_rollout_ref.rollout.name=vllm"

    def check(*overrides):
        return check_key_support(OmegaConf.to_object(parse_config(list(overrides))))

    with pytest.raises(ConfigError, match="hf rollout samples with the trainer's own"):
        check(tis)
    with pytest.raises(ConfigError, match="vanilla PPO loss only"):
        check(tis, vllm, "actor_rollout_ref.actor.policy_loss.loss_mode=gspo")
    assert check(tis, vllm) == []


def test_clip_ratio_alone_gives_a_notice_to_set_low_and_high():
    """The PPO loss clips at clip_ratio_low/high (0.2 each by default, as in verl): a run
    that changes only clip_ratio is told it has no effect and what to set instead."""
    actor = "actor_rollout_ref.actor"

    def notices(*overrides):
        return check_key_support(OmegaConf.to_object(parse_config(list(overrides))))

    (note,) = notices(f"{actor}.clip_ratio=0.3")
    assert f"{actor}.clip_ratio=0.3 has no effect" in note
    assert f"set {actor}.clip_ratio_low and {actor}.clip_ratio_high" in note
    assert notices(f"{actor}.clip_ratio=0.3", f"{actor}.clip_ratio_high=0.28") == []
    assert notices(f"{actor}.clip_ratio_low=0.1") == []
    assert rule_for(f"{actor}.clip_ratio", OmegaConf.to_object(parse_config([]))) is None
