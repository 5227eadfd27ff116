"""What this machine offers a run, read without importing torch or an engine: whether it
shows a GPU, and which optional packages are installed. The validation pass uses these
facts to refuse, before anything loads, what a worker would refuse only after loading.

Only certain facts count. This machine "shows no GPU" when ``CUDA_VISIBLE_DEVICES`` hides
every GPU, or (Linux) no GPU device node exists (NVIDIA's ``/dev/nvidia<N>``, WSL's
``/dev/dxg``, ROCm's ``/dev/kfd``); anything less certain is left to the workers. The
device facts apply only where the workers run on this machine: one worker (it runs in the
``siirl-train`` process) or a local Ray cluster (``trainer.ray_address=local``); a cluster
elsewhere may have GPUs this machine lacks.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import sys
from typing import Any, List, Optional

from siirl.params.key_paths import value_at
from siirl.params.sections import applying_mounts, installed_sections

__all__ = ["device_problems", "machine_view", "package_problems", "run_device",
           "shows_no_gpu", "workers_run_here"]

GPU_NODES = ("/dev/nvidia[0-9]*", "/dev/dxg", "/dev/kfd")


def _get(config: Any, key: str, default: Any = None) -> Any:
    return value_at(config, key, default)


def shows_no_gpu() -> bool:
    """True when this process certainly sees no GPU (False: it may see one)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return True
    if not sys.platform.startswith("linux"):
        return False
    return not any(glob.glob(pattern) for pattern in GPU_NODES)


def workers_run_here(config: Any) -> bool:
    """Whether every worker of the run computes on this machine."""
    nodes = _get(config, "trainer.nnodes", 1)
    per_node = _get(config, "trainer.n_gpus_per_node", 1)
    if not isinstance(nodes, int) or not isinstance(per_node, int):
        return False
    local_cluster = str(_get(config, "trainer.ray_address") or "").lower() == "local"
    return nodes * per_node == 1 or (nodes == 1 and local_cluster)


def run_device(config: Any) -> Optional[str]:
    """"cpu" or "cuda" as the workers will compute, where that is certain now; else None
    (``trainer.device=auto`` with workers elsewhere, or on a machine that may show a GPU)."""
    name = str(_get(config, "trainer.device", "auto") or "auto").lower()
    if name in ("cpu", "cuda"):
        return name
    if name == "auto" and workers_run_here(config) and shows_no_gpu():
        return "cpu"
    return None


def machine_view(config: Any) -> Any:
    """``config`` as the key rules should judge it on this machine: ``trainer.device=auto``
    reads ``cpu`` where the workers certainly compute on the CPU (so that the rules for a
    CPU run, CPU offload's, hold before anything loads)."""
    if str(_get(config, "trainer.device", "auto")).lower() != "auto" or \
            run_device(config) != "cpu":
        return config
    return dataclasses.replace(config, trainer=dataclasses.replace(config.trainer, device="cpu"))


def device_problems(config: Any) -> List[str]:
    """Settings a worker on this machine would refuse for want of a GPU."""
    here = workers_run_here(config) and shows_no_gpu()
    if not here:
        return []
    problems = []
    if str(_get(config, "trainer.device", "auto")).lower() == "cuda":
        problems.append("trainer.device=cuda, but this machine shows no GPU (no GPU device, "
                        "or CUDA_VISIBLE_DEVICES hides them all); use trainer.device=cpu or "
                        "trainer.device=auto, or check CUDA_VISIBLE_DEVICES")
    return problems


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def _needs(config: Any) -> List[tuple]:
    """(setting, importable module, package, pip line) for each optional package the run
    uses."""
    needs = []
    # a backend's or a rollout's own package (megatron-core, vllm), as its section says
    for section in installed_sections().values():
        mounts = applying_mounts(section, config)
        choice = str(_get(config, mounts[0].selector)) if mounts else ""
        need = section.requires_for.get(choice, section.requires) if mounts else ()
        if need:
            module, package, hint = need
            needs.append((f"{mounts[0].selector}={choice}", module, package, hint))
    rank = _get(config, "actor_rollout_ref.model.lora_rank") or 0
    if isinstance(rank, int) and rank > 0:
        needs.append((f"actor_rollout_ref.model.lora_rank={rank}", "peft", "peft",
                      'pip install "siirl-engine[lora]"'))
    loggers = _get(config, "trainer.logger") or []
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    for logger in ("tensorboard", "wandb"):
        if logger in loggers:
            needs.append((f"trainer.logger includes '{logger}'", logger, logger,
                          f"pip install {logger}"))
    return needs


def package_problems(config: Any) -> List[str]:
    """One line per optional package the configuration needs that is not installed."""
    return [f"{setting} needs the {package} package, which is not installed in this "
            f"environment: {hint}"
            for setting, module, package, hint in _needs(config) if not _installed(module)]
