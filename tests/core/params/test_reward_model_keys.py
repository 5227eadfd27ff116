"""Which reward-model keys a run reads, ignores with a notice, or refuses, with and without
reward_model.enable and for each style."""

import pytest

from siirl.errors import ConfigError
from siirl.params.parser import parse_config

ON = ["reward_model.enable=true"]
JUDGE = ON + ["reward_model.style=generative"]


@pytest.mark.parametrize("overrides", [
    ON + ["reward_model.model.path=builtin:tiny-reward", "reward_model.rm_weight=0.5",
          "reward_model.micro_batch_size_per_gpu=4", "reward_model.max_length=32",
          "reward_model.model.fsdp_config.fsdp_size=1", "reward_model.use_dynamic_bsz=true",
          "reward_model.forward_max_token_len_per_gpu=64"],
    JUDGE + ["reward_model.judge.template='Q {question} A {response} Score:'",
             "reward_model.judge.max_new_tokens=4", "reward_model.judge.max_score=5"],
    JUDGE + ["reward_model.judge.source=model", "reward_model.model.path=builtin:tiny-arith"],
    ON + ["reward_model.strategy=megatron", "reward_model.model.path=builtin:tiny-reward",
          "reward_model.megatron.dtype=bfloat16", "reward_model.micro_batch_size_per_gpu=4",
          "actor_rollout_ref.actor.strategy=megatron", "trainer.n_gpus_per_node=2",
          "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
          "reward_model.megatron.tensor_model_parallel_size=2"],
])
def test_read_without_notices(overrides, capsys):
    parse_config(overrides, validate=True)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("overrides,key", [
    (["reward_model.model.path=builtin:tiny-reward"], "reward_model.model.path"),
    (["reward_model.rm_weight=2"], "reward_model.rm_weight"),
    (ON + ["reward_model.judge.max_new_tokens=4"], "reward_model.judge.max_new_tokens"),
    (JUDGE + ["reward_model.micro_batch_size_per_gpu=4"],
     "reward_model.micro_batch_size_per_gpu"),
    (JUDGE + ["reward_model.model.path=x"], "reward_model.model.path"),
    (ON + ["reward_model.micro_batch_size=4"], "reward_model.micro_batch_size"),
    (ON + ["reward_model.model.use_remove_padding=true"], "reward_model.model.use_remove_padding"),
    (ON + ["reward_model.forward_max_token_len_per_gpu=64"],
     "reward_model.forward_max_token_len_per_gpu"),
    (ON + ["reward_model.megatron.tensor_model_parallel_size=2"],
     "reward_model.megatron.tensor_model_parallel_size"),
    (ON + ["reward_model.strategy=megatron", "reward_model.model.fsdp_config.fsdp_size=1"],
     "reward_model.model.fsdp_config.fsdp_size"),
    (ON + ["reward_model.strategy=megatron", "reward_model.megatron.optimizer_offload=true"],
     "reward_model.megatron.optimizer_offload"),
])
def test_notices(overrides, key, capsys):
    parse_config(overrides)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and key in err[0]


@pytest.mark.parametrize("overrides,match", [
    (JUDGE + ["reward_model.strategy=megatron"], "not a megatron model"),
    (ON + ["reward_model.strategy=megatron", "reward_model.megatron.tensor_model_parallel_size=2"],
     "actor_rollout_ref.actor.megatron"),
    (ON + ["reward_model.strategy=megatron", "reward_model.megatron.dtype=fp8"], "fp8"),
    (ON + ["reward_model.strategy=megatron", "reward_model.megatron.use_dist_checkpointing=true"],
     "score head"),
    (ON + ["reward_model.model.fsdp_config.param_offload=true"], "offload"),
    (ON + ["reward_model.ulysses_sequence_parallel_size=2"], "Ulysses"),
    (ON + ["reward_model.reward_manager=embodied"], "embodied reward manager"),
    (ON + ["reward_model.style=judge"], "reward_model.style"),
    (JUDGE + ["reward_model.judge.source=server"], "reward_model.judge.source"),
    (JUDGE + ["reward_model.judge.max_score=0"], "reward_model.judge.max_score"),
])
def test_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(overrides, validate=True)  # as siirl-train checks
