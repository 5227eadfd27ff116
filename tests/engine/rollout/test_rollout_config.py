"""The rollout engines' section (``siirl.config: rollout``): siirl-engine owns the vLLM/SGLang
keys of ``actor_rollout_ref.rollout``, spliced into the group in verl's order; under a rollout
that samples with the actor's own module (hf) they do not apply, and the rollouts that take
weight syncs are the ones the section names, not a list in core."""

import dataclasses
import importlib.util

import pytest
from omegaconf import OmegaConf

from siirl.engine.rollout import config as rollout_config
from siirl.params import RolloutArguments
from siirl.params.key_support import NOT_APPLYING, REFUSED, not_applying_notices, rule_for
from siirl.params.machine import package_problems
from siirl.params.parser import parse_config
from siirl.params.sections import actor_module_rollout, installed_sections, own_engine_rollout
from siirl.params.validation import config_problems

R = "actor_rollout_ref.rollout"
# verl's ppo_trainer.yaml order of the group's keys (the engine's among core's)
VERL_ORDER = [
    "name", "mode", "server_timeout_s", "seed_per_prompt", "chat_scheduler", "temperature",
    "top_k", "top_p", "use_fire_sampling", "prompt_length", "response_length", "dtype",
    "gpu_memory_utilization", "ignore_eos", "enforce_eager", "free_cache_engine",
    "load_format", "layered_summon", "tensor_model_parallel_size", "max_num_batched_tokens",
    "max_model_len", "max_num_seqs", "log_prob_micro_batch_size",
    "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz",
    "log_prob_max_token_len_per_gpu", "disable_log_stats", "enable_chunked_prefill",
    "do_sample", "n", "calculate_log_probs", "multi_stage_wake_up",
    "update_weights_bucket_megabytes", "model_update_frequency", "engine_kwargs",
]
ENGINE_KEYS = [f.name for f in dataclasses.fields(rollout_config.RolloutEngineArguments)]


def typed(*overrides):
    return OmegaConf.to_object(parse_config(list(overrides)))


def test_the_section_is_registered_and_its_keys_sit_where_verl_has_them():
    assert installed_sections()["rollout"] is rollout_config.SECTION
    names = [f.name for f in dataclasses.fields(RolloutArguments)]
    assert [n for n in names if n in VERL_ORDER] == VERL_ORDER
    assert set(ENGINE_KEYS) < set(VERL_ORDER)
    rollout = typed(f"{R}.gpu_memory_utilization=0.7", f"{R}.mode=server").actor_rollout_ref.rollout
    assert (rollout.gpu_memory_utilization, rollout.mode, rollout.load_format) == \
        (0.7, "server", "dummy_dtensor")


@pytest.mark.parametrize("key", ENGINE_KEYS)
def test_engine_keys_do_not_apply_to_the_hf_rollout(key):
    rule = rule_for(f"{R}.{key}", typed())
    assert rule is not None and rule.kind == NOT_APPLYING
    assert rule.tag == "no effect with the hf rollout"


def test_under_an_engine_rollout_they_are_read_except_the_unused_ones():
    for name in ("vllm", "sglang"):
        config = typed(f"{R}.name={name}")
        assert rule_for(f"{R}.gpu_memory_utilization", config) is None
        unused = rule_for(f"{R}.layered_summon", config)
        assert unused.tag == "no effect with the vllm and sglang rollouts"
    # core's keys stay core's: sampling settings are read by every rollout
    assert rule_for(f"{R}.temperature", typed()) is None


def test_which_rollouts_take_weight_syncs_is_what_the_section_declares():
    assert rollout_config.SECTION.weight_synced == ("vllm", "sglang")
    hf, vllm = typed(), typed(f"{R}.name=vllm")
    assert actor_module_rollout(hf) and not own_engine_rollout(hf)
    assert own_engine_rollout(vllm) and not actor_module_rollout(vllm)
    # core's rules on the weight-sync keys follow that fact
    assert rule_for(f"{R}.model_update_frequency", hf).kind == REFUSED
    assert rule_for(f"{R}.model_update_frequency", vllm) is None


def test_one_notice_line_for_engine_and_weight_sync_keys_under_hf():
    notices = not_applying_notices(typed(f"{R}.gpu_memory_utilization=0.7",
                                         f"{R}.update_weights_bucket_megabytes=8"))
    assert len(notices) == 1
    assert "gpu_memory_utilization=0.7" in notices[0] and \
        "update_weights_bucket_megabytes=8" in notices[0]


def test_its_ranges_relations_and_engine_checks_are_in_the_validation_pass():
    problems = config_problems(typed(f"{R}.gpu_memory_utilization=1.5", f"{R}.mode=batch",
                                     f"{R}.max_model_len=10"))
    assert f"{R}.gpu_memory_utilization=1.5: must be in (0, 1]" in problems
    assert f"{R}.mode='batch': must be one of: sync, server, async" in problems
    assert any(p.startswith(f"{R}.max_model_len=10 is shorter than") for p in problems)
    sglang = rollout_config.SECTION.run_problems(typed(f"{R}.name=sglang"), "cpu")
    assert any("needs a CUDA device" in p for p in sglang)
    assert any("runs SGLang as a server only" in p for p in sglang)
    assert rollout_config.SECTION.run_problems(typed(), "cpu") == []


def test_the_package_each_engine_needs_is_the_sections_to_name():
    assert package_problems(typed()) == []
    for name in ("vllm", "sglang"):
        needs = [p for p in package_problems(typed(f"{R}.name={name}"))
                 if p.startswith(f"{R}.name={name} needs the {name} package")]
        assert len(needs) == (importlib.util.find_spec(name) is None)
        assert all(f'pip install "siirl-engine[{name}]"' in p for p in needs)
