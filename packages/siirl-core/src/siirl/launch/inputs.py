"""The files a job's configuration names, checked before anything loads.

Without this check a missing dataset is found only after the model has loaded (and a
preset for the user's own model and data, ``configs/grpo_gsm8k.yaml``, ships placeholder
paths). One ``ConfigError`` names every missing path with its key (exit code 2).

Only a single-node job is checked here: on a cluster, a path may exist on the worker nodes
and not on the one that starts the job; the workers then report it themselves.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, List

from siirl.errors import ConfigError
from siirl.params import SiiRLArguments

MODEL_KEY = "actor_rollout_ref.model.path"
MANAGER_FILE_KEY = "reward_manager.module.path"  # read with reward_manager.source=importlib


def _paths(value: Any) -> Iterable[str]:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    return [str(v) for v in value]


def _is_local(model: str) -> bool:
    # The other forms (built-in, 'smollm2', a hub id in the HF cache) are the model
    # loader's to resolve; a path written as one is a local file or directory.
    return model.startswith(("/", "~", ".", "$")) or model.endswith(".gguf")


def _reward_manager_file(config: SiiRLArguments) -> str:
    """The file a reward manager class is loaded from ('' for none, or a pkg:// module)."""
    path = config.reward_manager.module.path or ""
    if config.reward_manager.source != "importlib" or path.startswith("pkg://"):
        return ""
    return path[len("file://"):] if path.startswith("file://") else path


def missing_inputs(config: SiiRLArguments) -> List[str]:
    """``key=path`` for every named input file or model directory that does not exist."""
    named = {"data.train_files": config.data.train_files,
             "data.val_files": config.data.val_files,
             "custom_reward_function.path": config.custom_reward_function.path}
    missing = [f"{key}={path}" for key, value in named.items() for path in _paths(value)
               if not Path(path).expanduser().is_file()]
    manager_file = _reward_manager_file(config)
    if manager_file and not Path(manager_file).expanduser().is_file():
        missing.append(f"{MANAGER_FILE_KEY}={manager_file}")
    model = config.actor_rollout_ref.model.path
    if model is not None and _is_local(str(model)) and \
            not Path(os.path.expandvars(str(model))).expanduser().exists():
        missing.append(f"{MODEL_KEY}={model}")
    return missing


def check_inputs(config: SiiRLArguments) -> None:
    """Raise ``ConfigError`` naming each missing input (single-node jobs only)."""
    if config.trainer.nnodes > 1:
        return
    missing = missing_inputs(config)
    if missing:
        raise ConfigError(
            f"{'this path does' if len(missing) == 1 else 'these paths do'} not exist: "
            f"{', '.join(missing)}; set {'it' if len(missing) == 1 else 'them'} to your own "
            "files on the command line (key=path)")
