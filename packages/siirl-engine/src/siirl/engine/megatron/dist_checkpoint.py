"""Start a megatron model from a megatron-core distributed checkpoint (verl's
``<role>.megatron.use_dist_checkpointing`` / ``dist_checkpointing_path``) instead of
converting the Hugging Face weights of the model path.

The checkpoint holds the model's ``sharded_state_dict`` as written by
``megatron.core.dist_checkpointing.save`` (``tools/megatron_dist_checkpoint.py`` converts an
HF model once; a siiRL megatron training checkpoint's ``dist_ckpt/`` folder is one too).
Its sharded tensors carry global offsets, so a checkpoint written at one TP/PP/EP layout
loads at any other: each rank reads only its own slices. The HF ``config.json`` of the model
path still gives the architecture (and the tokenizer).
"""

from __future__ import annotations

import os

import torch

from siirl.errors import ConfigError

# a siiRL training checkpoint keeps its weights here (siirl.engine.megatron.checkpointing)
TRAINING_CHECKPOINT_WEIGHTS = "dist_ckpt"


def checkpoint_dir(path: str | None, key: str) -> str:
    """The distributed-checkpoint folder of ``path`` (itself, or its ``dist_ckpt/`` when it
    is a siiRL training checkpoint); a clear error naming ``key`` where there is none."""
    from megatron.core.dist_checkpointing import check_is_distributed_checkpoint

    if not path:
        raise ConfigError(f"{key}.use_dist_checkpointing=true needs {key}.dist_checkpointing_path"
                          " (a megatron distributed checkpoint folder, written by "
                          "tools/megatron_dist_checkpoint.py or a siiRL megatron training "
                          "checkpoint); it is not set.")
    for candidate in (path, os.path.join(path, TRAINING_CHECKPOINT_WEIGHTS)):
        if os.path.isdir(candidate) and check_is_distributed_checkpoint(candidate):
            return candidate
    found = "does not exist" if not os.path.exists(path) else \
        "holds no megatron distributed checkpoint (no metadata.json from dist_checkpointing)"
    raise ConfigError(f"{key}.dist_checkpointing_path={path!r} {found}; with "
                      f"{key}.use_dist_checkpointing=true the model's weights are read from "
                      "that folder: write one with `python tools/megatron_dist_checkpoint.py "
                      "<hf model path> <folder>`, point it at a siiRL megatron checkpoint "
                      "(global_step_*/actor), or set use_dist_checkpointing=false to convert "
                      "the Hugging Face weights of the model path.")


def save_model(model: torch.nn.Module, directory: str) -> None:
    """Write this rank's part of ``model`` (collective over every rank)."""
    from megatron.core import dist_checkpointing

    os.makedirs(directory, exist_ok=True)
    dist_checkpointing.save(model.sharded_state_dict(), directory)


def load_model(model: torch.nn.Module, path: str | None, key: str) -> None:
    """Fill ``model`` (this rank's stage or chunks, any layout) from the checkpoint at
    ``path``, strictly: a checkpoint of another architecture is refused naming ``key``."""
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint.api import CheckpointException

    directory = checkpoint_dir(path, key)
    try:
        state = dist_checkpointing.load(model.sharded_state_dict(), directory)
        model.load_state_dict(state)
    # missing keys, shape mismatch: another model's checkpoint (torch's CheckpointException
    # is a BaseException carrying each rank's failure)
    except (Exception, CheckpointException) as exc:
        raise ConfigError(f"{key}.dist_checkpointing_path={path!r} does not fit the model "
                          f"of the model path's config.json ({_reason(exc)}); the checkpoint "
                          "must be of the same architecture (any TP/PP layout).") from exc


def _reason(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None)
    if failures:  # the first failing rank's own exception
        exc = next(iter(failures.values()))[0]
    text = str(exc).strip()
    return text.splitlines()[-1][:400] if text else type(exc).__name__
