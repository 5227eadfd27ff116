"""A mixture-of-experts model trains under ``strategy=megatron`` like under fsdp (CPU, GRPO).

The model is built here: the built-in tiny-arith Llama upcycled into a Mixtral with 4
experts, top-2 (each expert the dense MLP with 5% multiplicative noise, a random router),
so that it solves some of the main job's problems and the policy gradient is not zero.
The megatron actor (megatron's MoE layer: router, SequentialMLP experts, alltoall
dispatcher) must give the fsdp actor's (HF Mixtral's) loss, gradient norm and entropy
within 1e-5 relative at steps 1 and 2; step 2 also checks that the experts reached the
rollout through the weight sync. With expert parallelism (EP 2 on two Ray CPU workers, two
experts each, tokens exchanged by megatron's alltoall dispatcher over gloo) it must too.
"""

from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from test_megatron_engine import (  # noqa: E402
    MEGATRON,
    assert_close_steps,
    ray_workers,
    steps,
    train,
)

EXPERTS, TOP_K = 4, 2


def upcycled_mixtral(directory: Path) -> Path:
    """tiny-arith's weights in a Mixtral (saved with its tokenizer to ``directory``)."""
    import shutil

    from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM

    from siirl.engine.models.loader import tiny_arith_dir

    source = tiny_arith_dir()
    dense = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    c = dense.config
    config = MixtralConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_theta=10000.0, tie_word_embeddings=c.tie_word_embeddings,
        num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id)
    torch.manual_seed(0)
    moe = MixtralForCausalLM(config)
    dense_state, state = dense.state_dict(), moe.state_dict()
    with torch.no_grad():
        for name, tensor in state.items():
            if name in dense_state:
                tensor.copy_(dense_state[name])
        for layer in range(c.num_hidden_layers):
            mlp = f"model.layers.{layer}.mlp."
            gate_up = torch.cat([dense_state[mlp + "gate_proj.weight"],
                                 dense_state[mlp + "up_proj.weight"]])
            down = dense_state[mlp + "down_proj.weight"]
            for expert in range(EXPERTS):
                state[mlp + "experts.gate_up_proj"][expert].copy_(
                    gate_up * (1 + 0.05 * torch.randn_like(gate_up)))
                state[mlp + "experts.down_proj"][expert].copy_(
                    down * (1 + 0.05 * torch.randn_like(down)))
            state[mlp + "gate.weight"].normal_(0, 0.5)
    moe.load_state_dict(state)
    moe.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(Path(source) / name, directory / name)
    return directory


KEYS = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean")


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    return upcycled_mixtral(tmp_path_factory.mktemp("tiny_mixtral"))


@pytest.fixture(scope="module")
def common(moe_model):
    return [f"actor_rollout_ref.model.path={moe_model}", "trainer.total_training_steps=2",
            "trainer.save_freq=-1"]


@pytest.fixture(scope="module")
def fsdp_moe_run(tmp_path_factory, common):
    run = tmp_path_factory.mktemp("fsdp_moe")
    train(run, *common)
    fsdp = steps(run)
    assert fsdp[1]["critic/score/mean"] > 0, "the upcycled model must solve some problems"
    assert fsdp[1]["actor/grad_norm"] > 0
    return fsdp


def test_megatron_moe_actor_trains_like_fsdp(tmp_path, common, fsdp_moe_run):
    train(tmp_path, *MEGATRON, *common)
    megatron = steps(tmp_path)
    assert_close_steps(megatron, fsdp_moe_run, KEYS)
    assert all(megatron[step]["weight_sync/bytes"] > 0 for step in megatron)


def test_expert_parallel_2_on_two_cpu_workers_trains_like_one_fsdp_worker(
        tmp_path, common, fsdp_moe_run):
    """Two workers are two data-parallel ranks (each its own rows) and one expert-parallel
    group: the actor and the reference hold 2 of the 4 experts each. The step-2 checkpoint
    (weights and megatron's chained dense + expert optimizer) resumes step 3 exactly."""
    overrides, env = ray_workers(2)
    ep2 = [*MEGATRON, "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
           "actor_rollout_ref.ref.megatron.expert_model_parallel_size=2", *overrides, *common]
    whole = tmp_path / "whole"
    train(whole, *ep2, "trainer.total_training_steps=3", "trainer.save_freq=2", env=env)
    assert_close_steps(steps(whole), fsdp_moe_run, KEYS)
    resumed = tmp_path / "resumed"
    train(resumed, *ep2, "trainer.total_training_steps=3", "trainer.resume_mode=resume_path",
          f"trainer.resume_from_path={whole / 'global_step_2'}", env=env)
    assert sorted(steps(resumed)) == [3]
    for key in KEYS:
        assert steps(resumed)[3][key] == steps(whole)[3][key], key
