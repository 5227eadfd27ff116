"""Checkpoints of the megatron engines: weights through ``megatron.core.dist_checkpointing``
(each rank writes its part; reshardable to other TP/PP sizes), optimizer moments one file
per tensor x pipeline shard (data-parallel replicas are identical, so data-parallel rank 0
writes them), lr schedule and update count once, plus any replicated extra modules (the
critic's value head, which lives on the last pipeline stage).
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Any, Dict, Tuple

import torch

from siirl.dag_worker.checkpoint.errors import DamagedCheckpointError

logger = logging.getLogger(__name__)
DIST_CKPT, EXTRA_FILE, EXTRAS_FILE = "dist_ckpt", "extra.pt", "replicated_modules.pt"


def _tp_rank() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_rank()


def _writes_extras() -> bool:
    """One rank of the data-parallel rank 0 replicas writes the replicated files: TP rank 0
    of the last pipeline stage (the stage that holds the value head)."""
    from megatron.core import parallel_state

    return _tp_rank() == 0 and parallel_state.is_pipeline_last_stage()


def optimizer_file() -> str:
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    name = "optimizer"
    if tp > 1:
        name += f".tp{_tp_rank()}"
    if pp > 1:
        name += f".pp{parallel_state.get_pipeline_model_parallel_rank()}"
    return name + ".pt"


def _is_megatron_optimizer(optimizer) -> bool:
    from siirl.engine.megatron.optimizer_adapter import MegatronOptimizer

    return isinstance(optimizer, MegatronOptimizer)


def save_checkpoint(directory: str, model: torch.nn.Module, optimizer: Any,
                    extra: Dict[str, Any], contents: Tuple[str, ...], dp_rank: int,
                    replicated: Dict[str, torch.nn.Module]) -> None:
    """Collective over every rank: weights through dist_checkpointing, optimizer state,
    ``extra`` (lr schedule, update count) and the ``replicated`` modules once."""
    from megatron.core import dist_checkpointing

    os.makedirs(directory, exist_ok=True)
    if "model" in contents:
        os.makedirs(os.path.join(directory, DIST_CKPT), exist_ok=True)
        dist_checkpointing.save(model.sharded_state_dict(), os.path.join(directory, DIST_CKPT))
    if "optimizer" in contents and _is_megatron_optimizer(optimizer):
        optimizer.save(directory, write_layout=torch.distributed.get_rank() == 0)
    elif dp_rank == 0 and "optimizer" in contents:
        torch.save(optimizer.state_dict(), os.path.join(directory, optimizer_file()))
    if dp_rank == 0 and _writes_extras():
        if "extra" in contents:
            torch.save(extra, os.path.join(directory, EXTRA_FILE))
        if "model" in contents and replicated:
            torch.save({k: m.state_dict() for k, m in replicated.items()},
                       os.path.join(directory, EXTRAS_FILE))
    torch.distributed.barrier()


def check_pieces(directory: str, contents: Tuple[str, ...], optimizer: Any) -> None:
    """Refuse a checkpoint without a piece the run needs, before anything is loaded."""
    from siirl.engine.megatron.optimizer_adapter import OPTIM_DIR

    if "model" in contents and not os.path.isdir(os.path.join(directory, DIST_CKPT)):
        raise DamagedCheckpointError(f"checkpoint {directory} has no {DIST_CKPT}/ (the "
                                     "weights; or not written by the megatron engine)")
    if "optimizer" in contents and optimizer is not None and \
            not os.path.isdir(os.path.join(directory, OPTIM_DIR)) and \
            not glob.glob(os.path.join(directory, "optimizer*.pt")):
        raise DamagedCheckpointError(f"checkpoint {directory} holds no optimizer state "
                                     f"({OPTIM_DIR}/ or optimizer*.pt); resuming without it "
                                     "would not continue the run")
    if "extra" in contents and not os.path.exists(os.path.join(directory, EXTRA_FILE)):
        raise DamagedCheckpointError(f"checkpoint {directory} has no {EXTRA_FILE} (lr "
                                     "schedule and update count)")


def _read(directory: str, name: str) -> Any:
    try:
        return torch.load(os.path.join(directory, name), weights_only=True)
    except Exception as exc:  # truncated or not a torch file
        raise DamagedCheckpointError(f"checkpoint {directory}: {name} cannot be read "
                                     f"({str(exc).strip().splitlines()[0][:300]})") from exc


def load_checkpoint(directory: str, model: torch.nn.Module, optimizer: Any,
                    contents: Tuple[str, ...],
                    replicated: Dict[str, torch.nn.Module]) -> Dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote (weights reshard to this run's TP/PP
    sizes; optimizer state only at the same sizes: at other sizes it starts fresh, with
    a warning); the ``extra`` dict. A missing piece is refused before anything loads."""
    from megatron.core import dist_checkpointing

    check_pieces(directory, contents, optimizer)
    extra = _read(directory, EXTRA_FILE) if "extra" in contents else {}
    if "model" in contents:
        extras = os.path.join(directory, EXTRAS_FILE)
        saved = _read(directory, EXTRAS_FILE) if replicated and os.path.exists(extras) \
            else None
        state = dist_checkpointing.load(model.sharded_state_dict(),
                                        os.path.join(directory, DIST_CKPT))
        model.load_state_dict(state)
        for name, module in replicated.items() if saved is not None else ():
            module.load_state_dict(saved[name])
    optim = os.path.join(directory, optimizer_file())
    if "optimizer" in contents and _is_megatron_optimizer(optimizer):
        if not optimizer.load(directory):
            logger.warning("%s holds no optimizer state for this run's TP/PP/DP sizes "
                           "(megatron's distributed optimizer shards it by them); the "
                           "weights were resharded, the optimizer starts fresh", directory)
    elif "optimizer" in contents and os.path.exists(optim):
        optimizer.load_state_dict(_read(directory, optimizer_file()))
    elif "optimizer" in contents and glob.glob(os.path.join(directory, "optimizer*.pt")):
        # written at other TP/PP sizes: weights reshard, moments do not
        logger.warning("%s holds optimizer state for other tensor/pipeline-parallel sizes "
                       "than this run's; the weights were resharded, the optimizer starts "
                       "fresh", directory)
    return extra
