"""Engine checkpoints: weights as safetensors, optimizer and the rest with ``torch.save``.

A checkpoint is a directory written under a temporary name and renamed into place when
every file is written, so a directory with the final name is always complete; a crash
mid-write leaves only a ``*.tmp-*`` directory behind.

Sharded (FSDP2) modules are saved with ``torch.distributed.checkpoint`` under ``dcp/``:
every rank writes its own shard of the weights and optimizer state (``__<rank>_0.distcp``)
and rank 0 the index (``.metadata``), so no rank ever holds the whole model to save it.
Loading reshards: a ``dcp/`` checkpoint written by N ranks loads into M ranks, or into
one unsharded module. Unsharded modules write ``model.safetensors`` + ``optimizer.pt``;
those load into a sharded module as well (each rank takes its shard of the full state).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import uuid
import warnings
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch

from siirl.errors import DataError

MODEL_FILE = "model.safetensors"
SHARDED_DIR = "dcp"  # torch.distributed.checkpoint: one file per rank + .metadata
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


def optimizer_state_dict(module: torch.nn.Module,
                         optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """Unsharded optimizer state keyed by parameter names (not positions), so it loads
    into a sharded copy of the module too."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(module, optimizer)


def load_model_state(module: torch.nn.Module, state: Dict[str, torch.Tensor],
                     sharded: bool) -> None:
    if not sharded:
        module.load_state_dict(state, strict=True)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(module, state, options=_dcp_options(full_state_dict=True))


def load_optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         state: Dict[str, Any], sharded: bool) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    if not sharded and all(isinstance(k, int) for k in state.get("state", {})):
        optimizer.load_state_dict(state)  # positional keys: optimizer.state_dict()'s own
        return
    set_optimizer_state_dict(module, optimizer, state,
                             options=_dcp_options(full_state_dict=sharded))


def _sharded_state(module: torch.nn.Module, optimizer: Any, contents: Tuple[str, ...]
                   ) -> Dict[str, Any]:
    """The state DCP saves/loads in place: DTensor shards when sharded, plain tensors
    otherwise (DCP then reads the full tensors out of the shards)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    state: Dict[str, Any] = {}
    if "model" in contents:
        state["model"] = get_model_state_dict(module)
    if "optimizer" in contents and optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(module, optimizer)
    return state


def save_checkpoint(directory: str, module: torch.nn.Module, optimizer: Any, extra: Dict,
                    *, sharded: bool = False, rank: int = 0, group: Any = None,
                    contents: Tuple[str, ...] = ("model", "optimizer", "extra")) -> None:
    """Write ``contents`` of an engine to ``directory``; sharded: every rank of ``group``
    calls this and writes its own shard, rank 0 the extra state."""
    if sharded:
        import torch.distributed.checkpoint as dcp

        os.makedirs(directory, exist_ok=True)
        state = _sharded_state(module, optimizer, contents)
        if state:
            dcp.save(state, checkpoint_id=os.path.join(directory, SHARDED_DIR),
                     process_group=group)
        if rank == 0 and "extra" in contents:
            torch.save(extra, os.path.join(directory, EXTRA_FILE))
        torch.distributed.barrier(group=group)
        return
    weights = module.state_dict() if "model" in contents else None
    optim = optimizer_state_dict(module, optimizer) \
        if "optimizer" in contents and optimizer is not None else None
    with atomic_dir(directory) as tmp:
        if weights is not None:
            save_tensors(weights, os.path.join(tmp, MODEL_FILE))
        if optim is not None:
            torch.save(optim, os.path.join(tmp, OPTIMIZER_FILE))
        if "extra" in contents:
            torch.save(extra, os.path.join(tmp, EXTRA_FILE))


def load_checkpoint(directory: str, module: torch.nn.Module, optimizer: Any, *,
                    sharded: bool = False, group: Any = None,
                    contents: Tuple[str, ...] = ("model", "optimizer", "extra")) -> Dict:
    """Restore what ``directory`` holds of ``contents``; returns the extra dict ({} if none).

    Every rank reads the files itself (the directory must be visible to all ranks).
    """
    if not os.path.isdir(directory):
        raise DataError(f"no checkpoint directory at {directory}")
    dcp_dir = os.path.join(directory, SHARDED_DIR)
    if os.path.isdir(dcp_dir):
        _load_sharded(dcp_dir, module, optimizer, contents, sharded, group)
    else:
        _load_full(directory, module, optimizer, contents, sharded)
    extra_path = os.path.join(directory, EXTRA_FILE)
    extra = {}
    if "extra" in contents and os.path.exists(extra_path):
        extra = torch.load(extra_path, weights_only=True)
    if sharded:
        torch.distributed.barrier(group=group)
    return extra


def _load_sharded(dcp_dir: str, module: torch.nn.Module, optimizer: Any,
                  contents: Tuple[str, ...], sharded: bool, group: Any) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state = _sharded_state(module, optimizer, contents)
    if not state:
        return
    with warnings.catch_warnings():  # "assuming ... a single process": yes, deliberately
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.load(state, checkpoint_id=dcp_dir, process_group=group if sharded else None,
                 no_dist=not sharded)
    if "model" in state:
        set_model_state_dict(module, state["model"])
    if "optimizer" in state:
        set_optimizer_state_dict(module, optimizer, state["optimizer"])


def _load_full(directory: str, module: torch.nn.Module, optimizer: Any,
               contents: Tuple[str, ...], sharded: bool) -> None:
    model_path = os.path.join(directory, MODEL_FILE)
    if "model" in contents:
        if not os.path.exists(model_path):
            raise DataError(f"checkpoint {directory} has no {MODEL_FILE} and no "
                            f"{SHARDED_DIR}/")
        load_model_state(module, load_tensors(model_path), sharded)
    optim_path = os.path.join(directory, OPTIMIZER_FILE)
    if "optimizer" in contents and optimizer is not None and os.path.exists(optim_path):
        load_optimizer_state(module, optimizer, torch.load(optim_path, weights_only=True),
                             sharded)


def save_pretrained_dir(directory: str, module: torch.nn.Module,
                        state: Dict[str, torch.Tensor], tokenizer: Any = None,
                        finish: Optional[Callable[[str], None]] = None) -> None:
    """A plain transformers directory (config, safetensors ``state``, tokenizer), written
    atomically; ``finish(tmp_dir)`` may fix files before the directory appears."""
    with atomic_dir(directory) as tmp:
        kwargs: Dict[str, Any] = {"state_dict": state}
        if "safe_serialization" in inspect.signature(module.save_pretrained).parameters:
            kwargs["safe_serialization"] = True  # transformers 4.x
        module.save_pretrained(tmp, **kwargs)
        if finish is not None:
            finish(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
