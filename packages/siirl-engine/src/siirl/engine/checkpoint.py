"""Engine checkpoints: weights as safetensors, optimizer and the rest with ``torch.save``.

A checkpoint is a directory written under a temporary name and renamed into place when
every file is written, so a directory with the final name is always complete; a crash
mid-write leaves only a ``*.tmp-*`` directory behind.

Sharded (FSDP2) modules are saved as full, unsharded state dicts gathered on rank 0, so a
checkpoint's weights load into any layout. Optimizer state is keyed by parameter names
when sharded and by position otherwise; restore it under the same layout.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from typing import Any, Dict, Iterator, Tuple

import torch

from siirl.errors import DataError

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
EXTRA_FILE = "extra.pt"
_ALIASES_KEY = "siirl_aliases"  # safetensors metadata: {alias: stored name} of tied weights


@contextlib.contextmanager
def atomic_dir(final_dir: str) -> Iterator[str]:
    """Yield a fresh temporary directory that replaces ``final_dir`` once the block ends."""
    final_dir = os.path.abspath(final_dir)
    parent = os.path.dirname(final_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = f"{final_dir}.tmp-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if os.path.exists(final_dir):
        # Move the old copy aside first: os.replace cannot swap over a non-empty directory.
        old = f"{final_dir}.old-{uuid.uuid4().hex[:8]}"
        os.replace(final_dir, old)
    os.replace(tmp, final_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_tensors(state_dict: Dict[str, torch.Tensor], path: str) -> None:
    """safetensors file of ``state_dict``; tensors sharing storage (tied weights) are stored
    once and recorded as aliases, since safetensors refuses shared storage."""
    from safetensors.torch import save_file

    tensors: Dict[str, torch.Tensor] = {}
    aliases: Dict[str, str] = {}
    seen: Dict[Tuple, str] = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tensor.stride(), tensor.dtype)
        if tensor.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = tensor.cpu().contiguous().clone()
    save_file(tensors, path, metadata={_ALIASES_KEY: json.dumps(aliases)})


def load_tensors(path: str) -> Dict[str, torch.Tensor]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(path, framework="pt") as handle:
        aliases = json.loads((handle.metadata() or {}).get(_ALIASES_KEY, "{}"))
    tensors = load_file(path)
    for alias, name in aliases.items():
        tensors[alias] = tensors[name]
    return tensors


def _dcp_options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def model_state_dict(module: torch.nn.Module, sharded: bool) -> Dict[str, torch.Tensor]:
    """Full weights (collective when sharded: every rank must call; rank 0 gets them)."""
    if not sharded:
        return module.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(module, options=_dcp_options(full_state_dict=True,
                                                             cpu_offload=True))


def optimizer_state_dict(module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         sharded: bool) -> Dict[str, Any]:
    if not sharded:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(module, optimizer,
                                    options=_dcp_options(full_state_dict=True, cpu_offload=True))


def load_model_state(module: torch.nn.Module, state: Dict[str, torch.Tensor],
                     sharded: bool) -> None:
    if not sharded:
        module.load_state_dict(state, strict=True)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(module, state, options=_dcp_options(full_state_dict=True))


def load_optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         state: Dict[str, Any], sharded: bool) -> None:
    if not sharded:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(module, optimizer, state, options=_dcp_options(full_state_dict=True))


def _barrier(sharded: bool) -> None:
    if sharded:
        torch.distributed.barrier()


def save_checkpoint(directory: str, module: torch.nn.Module, optimizer: Any, extra: Dict,
                    *, sharded: bool = False, rank: int = 0,
                    contents: Tuple[str, ...] = ("model", "optimizer", "extra")) -> None:
    """Write ``contents`` of an engine to ``directory`` (rank 0 writes; all ranks call)."""
    weights = model_state_dict(module, sharded) if "model" in contents else None
    optim = (optimizer_state_dict(module, optimizer, sharded)
             if "optimizer" in contents and optimizer is not None else None)
    if rank == 0:
        with atomic_dir(directory) as tmp:
            if weights is not None:
                save_tensors(weights, os.path.join(tmp, MODEL_FILE))
            if optim is not None:
                torch.save(optim, os.path.join(tmp, OPTIMIZER_FILE))
            if "extra" in contents:
                torch.save(extra, os.path.join(tmp, EXTRA_FILE))
    _barrier(sharded)


def load_checkpoint(directory: str, module: torch.nn.Module, optimizer: Any, *,
                    sharded: bool = False,
                    contents: Tuple[str, ...] = ("model", "optimizer", "extra")) -> Dict:
    """Restore what ``directory`` holds of ``contents``; returns the extra dict ({} if none).

    Every rank reads the files itself (the directory must be visible to all ranks).
    """
    if not os.path.isdir(directory):
        raise DataError(f"no checkpoint directory at {directory}")
    model_path = os.path.join(directory, MODEL_FILE)
    if "model" in contents:
        if not os.path.exists(model_path):
            raise DataError(f"checkpoint {directory} has no {MODEL_FILE}")
        load_model_state(module, load_tensors(model_path), sharded)
    optim_path = os.path.join(directory, OPTIMIZER_FILE)
    if "optimizer" in contents and optimizer is not None and os.path.exists(optim_path):
        load_optimizer_state(module, optimizer, torch.load(optim_path, weights_only=True),
                             sharded)
    extra_path = os.path.join(directory, EXTRA_FILE)
    extra = {}
    if "extra" in contents and os.path.exists(extra_path):
        extra = torch.load(extra_path, weights_only=True)
    _barrier(sharded)
    return extra
