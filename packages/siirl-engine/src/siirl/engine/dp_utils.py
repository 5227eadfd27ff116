"""What the data-parallel actor and critic share: field checks, gradient clipping, and
summing per-rank metric shares over the data-parallel group."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

from siirl.errors import DataError


def dist_active(world_size: int) -> bool:
    return (world_size > 1 and torch.distributed.is_available()
            and torch.distributed.is_initialized())


def backend(group: Any) -> str:
    return str(torch.distributed.get_backend(group)).lower()


def require(batch: Any, keys: Tuple[str, ...], what: str) -> None:
    missing = [key for key in keys if key not in batch.keys()]
    if missing:
        raise DataError(f"{what} needs batch fields {missing}; the batch has "
                        f"{sorted(batch.keys())}")


def clip_grad_norm(module: torch.nn.Module, clip: Any) -> float:
    """Clip to ``clip`` (<= 0 or None: measure only); the global norm as a float."""
    params = [p for p in module.parameters() if p.requires_grad]
    max_norm = float(clip) if clip and clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if hasattr(norm, "full_tensor"):  # FSDP2: a replicated DTensor
        norm = norm.full_tensor()
    return float(norm)


def dp_sum(metrics: Dict[str, float], world_size: int, group: Any,
           device: torch.device) -> Dict[str, float]:
    """Sum per-rank shares over the data-parallel ranks so every rank has the global value
    (NCCL needs the values on the device)."""
    if not dist_active(world_size) or not metrics:
        return metrics
    keys = sorted(metrics)
    values = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
    if backend(group) == "nccl":
        values = values.to(device)
    torch.distributed.all_reduce(values, group=group)
    return {k: float(v) for k, v in zip(keys, values.cpu(), strict=True)}
