"""A refusal's "what works instead" never names something that is itself refused under the
same conditions: megatron's context parallelism (refused by the validation pass and the
megatron engine) is never suggested, and megatron's offload points a CPU run nowhere."""

import re

import pytest

from siirl.engine.megatron.config import megatron_size_problems
from siirl.errors import ConfigError
from siirl.params.key_support import REFUSED, RULES
from siirl.params.parser import parse_config

MEGATRON = ["actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron"]


def _refusal(overrides):
    with pytest.raises(ConfigError) as info:
        parse_config(overrides, validate=True)
    return str(info.value)


def test_context_parallelism_is_refused():
    assert megatron_size_problems(2, 1, None)  # what the rules below must never suggest


def test_no_rule_suggests_setting_context_parallel_size():
    # a rule may say context parallelism is unsupported, never "set ...context_parallel_size"
    for rule in RULES:
        for mention in re.finditer(r"[\w.]*context_parallel_size[^.;]*", rule.why):
            assert "leave it at 1" in rule.why or "not supported" in rule.why, \
                (rule.patterns, mention.group(0))
        if rule.kind == REFUSED and "set the same key under" in rule.why:
            assert not any(p.endswith("context_parallel_size") for p in rule.patterns)


@pytest.mark.parametrize("overrides", [
    MEGATRON + ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
    MEGATRON + ["critic.ulysses_sequence_parallel_size=2"],
])
def test_ulysses_on_megatron_suggests_tensor_parallelism_with_sequence_parallel(overrides):
    text = _refusal(overrides)
    assert "tensor_model_parallel_size" in text and "sequence_parallel=true" in text, text
    assert "context_parallel_size" not in text, text


@pytest.mark.parametrize("role", ["actor_rollout_ref.ref", "critic"])
def test_another_roles_context_parallel_size_is_not_sent_to_the_actor(role):
    text = _refusal(MEGATRON + [f"{role}.megatron.context_parallel_size=2"])
    assert "leave it at 1" in text and "sequence_parallel=true" in text, text
    assert "set the same key under" not in text, text


def test_the_suggested_megatron_split_is_accepted():
    # what the Ulysses refusal suggests instead, on the same megatron run
    parse_config(MEGATRON + ["trainer.n_gpus_per_node=2", "trainer.device=cpu",
                             "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                             "actor_rollout_ref.actor.megatron.sequence_parallel=true"],
                 validate=True, check_support=True)


def test_megatron_offload_on_a_cpu_run_does_not_suggest_fsdp_offload_there():
    text = _refusal(MEGATRON + ["trainer.device=cpu",
                                "actor_rollout_ref.actor.megatron.param_offload=true"])
    assert "so there is nothing to free: leave it false" in text, text
    assert "fsdp" not in text, text
    # fsdp offload is refused on a CPU run too
    assert "nothing to offload" in _refusal(
        ["trainer.device=cpu", "actor_rollout_ref.actor.fsdp_config.param_offload=true"])
