"""Checkpoints and HF export of a LoRA actor (``siirl.engine.models.lora``): the adapters
only, never the frozen base weights, which the run reloads from the model path.

A checkpoint folder is a peft adapter folder plus the training state::

    adapter_config.json, adapter_model.safetensors   (PeftModel.from_pretrained loads it)
    optimizer.pt, extra.pt                           (the adapters' moments, lr schedule)

The adapters are small, so a sharded (FSDP2) actor gathers them whole and the first rank
writes one copy for any layout; every rank reads that copy back and keeps its shard. The
HF export is the adapter folder with the tokenizer, and, with
``actor_rollout_ref.model.lora_merge_on_export``, the merged full model under ``merged/``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Tuple

import torch

from siirl.dag_worker.checkpoint.errors import CheckpointError, DamagedCheckpointError
from siirl.engine.common import checkpoint as ckpt
from siirl.engine.models import lora

MERGED_DIR = "merged"


def _optimizer_state(backend: Any) -> Dict[str, Any]:
    """The optimizer state keyed by parameter names; whole tensors (collective) when
    sharded, and then only on the first rank."""
    if not backend.sharded:
        return ckpt.optimizer_state_dict(backend.module, backend.optimizer)
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    return get_optimizer_state_dict(backend.module, backend.optimizer,
                                    options=StateDictOptions(full_state_dict=True,
                                                             cpu_offload=True))


def _barrier(backend: Any) -> None:
    if backend.sharded or backend.replicated:
        torch.distributed.barrier(group=backend.shard_group)


def save_checkpoint(directory: str, backend: Any, extra: Dict[str, Any],
                    contents: Tuple[str, ...]) -> None:
    """Write ``contents`` (model: the adapters) of ``backend``; every rank calls."""
    module = backend.module
    state = lora.adapter_state(module) if "model" in contents else None
    optim = _optimizer_state(backend) \
        if "optimizer" in contents and backend.optimizer is not None else None
    if backend.shard_rank == 0:
        with ckpt.atomic_dir(directory) as tmp:
            if state is not None:
                lora.save_adapter(tmp, module, state)
            if optim is not None:
                torch.save(optim, os.path.join(tmp, ckpt.OPTIMIZER_FILE))
            if "extra" in contents:
                torch.save(extra, os.path.join(tmp, ckpt.EXTRA_FILE))
    _barrier(backend)


def load_checkpoint(directory: str, backend: Any, contents: Tuple[str, ...]) -> Dict:
    """Restore what ``directory`` holds of ``contents``; returns the extra dict. Every file
    is read and checked before anything changes."""
    if not os.path.isdir(directory):
        raise DamagedCheckpointError(f"no checkpoint directory at {directory}")
    module, optimizer = backend.module, backend.optimizer
    extra = ckpt.read_extra(directory) if "extra" in contents else {}
    state = lora.read_adapter(directory, module) if "model" in contents else None
    optim = ckpt.read_optimizer(directory) \
        if "optimizer" in contents and optimizer is not None else None
    if state is not None:
        lora.load_adapter_state(module, state)
    if optim is not None:
        try:
            ckpt.load_optimizer_state(module, optimizer, optim, backend.sharded)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"checkpoint {directory}: {ckpt.OPTIMIZER_FILE} does not "
                                  f"match this run's LoRA optimizer ({exc})") from exc
    _barrier(backend)
    return extra


def export_hf(directory: str, backend: Any, tokenizer: Any, merged: bool) -> None:
    """The adapter folder with the tokenizer; ``merged``: also the merged full model in
    ``merged/`` (a plain transformers folder). Every rank calls."""
    module = backend.module
    state = lora.adapter_state(module)
    first = backend.shard_rank == 0
    weights = None
    if merged:  # whole tensors on every rank one at a time; the first rank keeps them
        weights = {}
        for name, tensor in lora.merged_weights(module):
            if first:
                weights[name] = tensor.cpu()
    if first:
        with ckpt.atomic_dir(directory) as tmp:
            lora.save_adapter(tmp, module, state)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            if weights is not None:
                ckpt.save_pretrained_dir(os.path.join(tmp, MERGED_DIR),
                                         module.get_base_model(), weights, tokenizer)
    _barrier(backend)
