"""Checkpoints and HF export of a megatron LoRA actor (``siirl.engine.megatron.lora``): the
adapters only, never the frozen base weights, which the run rebuilds from the model path.

The weights are a peft adapter folder with the HF model's names, gathered over TP and the
pipeline stages and written once (global rank 0), so ``PeftModel.from_pretrained`` loads it
on the HF model and any TP and PP size reads it back::

    adapter_config.json, adapter_model.safetensors   (the adapters)
    dist_optim/ or optimizer*.pt, extra.pt           (the adapters' moments, lr schedule:
                                                      siirl.engine.megatron.checkpointing)
"""

from __future__ import annotations

import os
from typing import Any, Dict, Tuple

import torch

from siirl.engine.common import checkpoint as ckpt
from siirl.engine.megatron import checkpointing
from siirl.engine.megatron.lora import LoraSettings
from siirl.engine.megatron.lora_state import (
    adapter_state,
    iter_merged_hf_weights,
    load_adapter_state,
    peft_config,
)
from siirl.engine.models.lora import ADAPTER_WEIGHTS

MERGED_DIR = "merged"


def _rest(contents: Tuple[str, ...]) -> Tuple[str, ...]:
    return tuple(c for c in contents if c != "model")


def write_adapter(directory: str, settings: LoraSettings, state: Dict[str, torch.Tensor],
                  base_model: str | None = None) -> None:
    """``adapter_config.json`` + ``adapter_model.safetensors`` into ``directory``."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    peft_config(settings, base_model).save_pretrained(directory)
    save_file({k: v.contiguous() for k, v in state.items()},
              os.path.join(directory, ADAPTER_WEIGHTS), metadata={"format": "pt"})


def save_checkpoint(directory: str, backend: Any, extra: Dict[str, Any],
                    contents: Tuple[str, ...]) -> None:
    """Collective over every rank: the adapters (gathered over TP and PP), then the optimizer and
    ``extra`` as a full-weight megatron checkpoint writes them."""
    if "model" in contents:
        state = adapter_state(backend.schedule_model)
        if torch.distributed.get_rank() == 0:
            write_adapter(directory, backend.lora, state)
    checkpointing.save_checkpoint(directory, backend.schedule_model, backend.optimizer, extra,
                                  _rest(contents), backend.dp_rank, backend.replicated)


def read_adapter(directory: str) -> Dict[str, torch.Tensor]:
    from siirl.dag_worker.checkpoint.errors import CheckpointError, DamagedCheckpointError

    path = os.path.join(directory, ADAPTER_WEIGHTS)
    if os.path.exists(path):
        return ckpt.load_tensors(path)
    if os.path.isdir(os.path.join(directory, checkpointing.DIST_CKPT)):
        raise CheckpointError(
            f"checkpoint {directory} holds full model weights (written without LoRA), but "
            "this run trains LoRA adapters (actor_rollout_ref.model.lora_rank > 0); resume "
            "it with lora_rank=0, or start a new run")
    raise DamagedCheckpointError(f"checkpoint {directory} has no {ADAPTER_WEIGHTS} (the "
                                 "LoRA adapter weights)")


def load_checkpoint(directory: str, backend: Any, contents: Tuple[str, ...]) -> Dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote; the adapters are checked against the
    model's (names, shapes) before any is copied."""
    from siirl.dag_worker.checkpoint.errors import CheckpointError

    if "model" in contents:
        state = read_adapter(directory)
        try:
            load_adapter_state(backend.schedule_model, state)
        except (KeyError, ValueError) as exc:
            raise CheckpointError(
                f"checkpoint {directory} does not match this run's LoRA adapters ({exc}); "
                "it was written with another model or other actor_rollout_ref.model."
                "lora_rank / target_modules") from exc
    return checkpointing.load_checkpoint(directory, backend.schedule_model, backend.optimizer,
                                         _rest(contents), backend.replicated)


def export_hf(directory: str, backend: Any, tokenizer: Any, merged: bool) -> None:
    """The adapter folder with the tokenizer; ``merged``: also the merged full model in
    ``merged/`` (a plain transformers folder). Collective over every rank."""
    from siirl.engine.common.weight_sync import DEFAULT_BUCKET_BYTES, copy_into

    state = adapter_state(backend.schedule_model)
    hf_config = backend.hf_module.config
    if merged:
        copy_into(backend.hf_module, iter_merged_hf_weights(
            backend.schedule_model, hf_config, DEFAULT_BUCKET_BYTES, backend.tp_group,
            backend.stages))
    if torch.distributed.get_rank() == 0:
        write_adapter(directory, backend.lora, state)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)
        if merged:
            ckpt.save_pretrained_dir(os.path.join(directory, MERGED_DIR), backend.hf_module,
                                     backend.hf_module.state_dict(), tokenizer)
    torch.distributed.barrier()
