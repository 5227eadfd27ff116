"""``sglang`` rollout: the ``vllm`` rollout's logic (weight sync, seeded prompt groups,
response fields, ``rollout_log_probs``, sleep between rollouts) with an SGLang server per
worker as its engine (``sglang_server.SGLangEngine``).

SGLang runs only as a server here (``rollout.mode=server``, verl's ``async``) and only on
CUDA (its kernels are CUDA-only; ``pip install "siirl-engine[sglang]"``). The rollout keys
become ``sglang.launch_server`` flags (:func:`launch_args`); ``engine_kwargs.sglang.*`` add
flags of their own (``attention_backend: fa3`` -> ``--attention-backend fa3``; true -> a bare
flag), after ours, so they win. ``engine_kwargs.sglang.enable_deterministic_inference=true``
makes SGLang honour the per-sample seeds (otherwise it samples from its own generator).
"""

from __future__ import annotations

import importlib
import json
import tempfile
from pathlib import Path
from typing import Any, Dict, List

import torch

from siirl.engine.rollout import vllm_engine
from siirl.engine.rollout.settings import sglang_device_problems, sglang_problems
from siirl.engine.rollout.vllm_rollout import VLLMRollout
from siirl.errors import ConfigError, PluginNotFoundError

ROLLOUT = vllm_engine.ROLLOUT
INSTALL_HINT = ('install SGLang with `pip install "siirl-engine[sglang]"` (CUDA only; it '
                "brings its own torch pin)")
_SEED_BITS = (1 << 31) - 1  # SGLang 0.5.3 holds the seeds as int32


def import_sglang() -> Any:
    """The ``sglang`` module, or a clear error naming the extra."""
    try:
        return importlib.import_module("sglang")
    except ImportError as exc:
        raise PluginNotFoundError(f"{ROLLOUT}.name=sglang but SGLang cannot be imported "
                                  f"({exc}); {INSTALL_HINT}.") from exc


def check_settings(rollout: Any) -> None:
    """Refuse rollout settings the sglang rollout does not honour (the validation pass
    refuses the same before anything loads)."""
    problems = sglang_problems(rollout)
    if problems:
        raise ConfigError(problems[0])


def flag_args(extra: Dict[str, Any]) -> List[str]:
    """``engine_kwargs.sglang`` as flags: SGLang's booleans are bare flags (false and null
    leave SGLang's default), lists and dicts JSON."""
    args: List[str] = []
    for key, value in extra.items():
        flag = "--" + str(key).replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, (dict, list, tuple)):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


def launch_args(cfg: Any, hf_config: Any, model_dir: str, free_cache: bool) -> List[str]:
    """``sglang.launch_server`` flags (but host and port) for the run's config."""
    rollout = cfg.actor_rollout_ref.rollout
    max_len = vllm_engine.max_model_len(cfg, hf_config)
    batched = max(int(rollout.max_num_batched_tokens), max_len)
    args = [
        "--model-path", str(model_dir),
        "--skip-tokenizer-init",  # token ids in, token ids out
        "--dtype", vllm_engine.engine_dtype(rollout),
        "--load-format", vllm_engine.engine_load_format(rollout),
        "--mem-fraction-static", str(float(rollout.gpu_memory_utilization)),
        "--tp-size", "1",
        "--random-seed", str(int(cfg.trainer.seed or 0)),
        "--context-length", str(max_len),
        "--max-running-requests", str(int(rollout.max_num_seqs)),
        "--max-prefill-tokens", str(batched),
        "--chunked-prefill-size", str(batched if rollout.enable_chunked_prefill else -1),
        # SGLang's throughput lines are its INFO logs
        "--log-level", "warning" if rollout.disable_log_stats else "info",
    ]
    if rollout.enforce_eager:
        args.append("--disable-cuda-graph")
    if free_cache:  # sleep: weights kept in CPU memory, KV cache freed
        args += ["--enable-memory-saver", "--enable-weights-cpu-backup"]
    if cfg.actor_rollout_ref.model.trust_remote_code:
        args.append("--trust-remote-code")
    return args + flag_args(dict((rollout.engine_kwargs or {}).get("sglang") or {}))


class SGLangRollout(VLLMRollout):
    """Rollout engine ``sglang``: ``generate(batch, validate=False) -> NodeOutput``."""

    rollout_name = "sglang"

    def _check_settings(self, rollout: Any) -> None:
        check_settings(rollout)

    def _start(self) -> Any:
        from transformers import AutoConfig

        from siirl.engine.rollout.sglang_server import SGLangEngine

        problems = sglang_device_problems(self.device_type)
        if problems:
            raise ConfigError(problems[0])
        import_sglang()
        model_path = self.cfg.actor_rollout_ref.model.path
        model_dir = vllm_engine.model_directory(model_path)
        hf_config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        run_dir = self.cfg.trainer.default_local_dir
        log_dir = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="siirl-sglang-"))
        rank = int(getattr(self.worker, "rank", 0) or 0)
        return SGLangEngine(launch_args(self.cfg, hf_config, model_dir, self.free_cache),
                            float(self.cfg.actor_rollout_ref.rollout.server_timeout_s),
                            log_dir / f"sglang_server_rank{rank}.log", model_dir)

    def request_fields(self, params: dict, n: int, width: int, eos_ids: list,
                       keys: torch.Tensor) -> list:
        """Per prompt, the sampling params of each of its ``n`` samples (SGLang's names),
        seeded by the group's noise key and the sample's place in it."""
        common = dict(max_new_tokens=width, top_p=params["top_p"],
                      top_k=params["top_k"] if params["top_k"] > 0 else -1,
                      stop_token_ids=list(eos_ids),
                      ignore_eos=bool(self.cfg.actor_rollout_ref.rollout.ignore_eos))
        if params["greedy"]:
            return [[dict(temperature=0.0, **common) for _ in range(n)] for _ in keys]
        return [[dict(temperature=params["temperature"],
                      sampling_seed=(int(key) + i) & _SEED_BITS, **common) for i in range(n)]
                for key in keys.tolist()]
