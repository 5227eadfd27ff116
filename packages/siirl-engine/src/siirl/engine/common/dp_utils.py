"""What the data-parallel actor and critic share: field checks, gradient clipping, and
summing per-rank metric shares over the data-parallel group."""

from __future__ import annotations

import math
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


def clip_grad_norm(module: torch.nn.Module, clip: Any, tp_group: Any = None,
                   pp_group: Any = None, ep_group: Any = None) -> float:
    """Clip to ``clip`` (<= 0 or None: measure only); the global norm as a float.

    Megatron model parallelism: with ``tp_group`` parameters marked
    ``tensor_model_parallel`` hold one shard each, so their squared norms are summed over
    the group, the others are replicated and count once; with ``pp_group`` every pipeline
    stage holds its own layers, so the stages' squares are summed, except copies marked
    ``shared`` (the last stage's copy of tied embeddings) which count on the first stage;
    expert parameters (those megatron marks ``allreduce=False``: laid out apart from the
    dense ones) are each rank's own shards of its experts, so their squares are summed over
    ``ep_group`` (megatron's expert tensor-and-model-parallel group; None: one rank), as
    megatron's optimizer sums them over its expert groups, never over ``tp_group``."""
    params = [p for p in module.parameters() if p.requires_grad]
    max_norm = float(clip) if clip and clip > 0 else float("inf")
    if tp_group is not None or pp_group is not None or ep_group is not None:
        return _clip_model_parallel(params, max_norm, tp_group, pp_group, ep_group)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if hasattr(norm, "full_tensor"):  # FSDP2: a replicated DTensor
        norm = norm.full_tensor()
    return float(norm)


def step_if_finite(optimizer: Any, grad_norm: float) -> float:
    """Step unless ``grad_norm`` is not finite; then drop the gradients instead, so one bad
    batch cannot poison the weights or the optimizer moments. Returns ``grad_norm``."""
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    return grad_norm


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


def _clip_model_parallel(params: list, max_norm: float, tp_group: Any,
                         pp_group: Any, ep_group: Any = None) -> float:
    grads = [(p, p.grad) for p in params if p.grad is not None]
    device = grads[0][1].device if grads else (params[0].device if params else "cpu")
    # squared norms: [dense TP shards, dense TP replicas (counted once), experts]
    squares_of = torch.zeros(3, dtype=torch.float64, device=device)
    for param, grad in grads:
        if pp_group is not None and getattr(param, "shared", False):
            continue  # counted on the stage that owns the original
        kind = 2 if not getattr(param, "allreduce", True) else \
            0 if getattr(param, "tensor_model_parallel", False) else 1
        squares_of[kind] += grad.detach().double().pow(2).sum()
    sharded, replicated, experts = squares_of.unbind()
    if tp_group is not None:
        sharded = sharded.clone()
        torch.distributed.all_reduce(sharded, group=tp_group)
    dense = sharded + replicated
    if ep_group is not None:  # the other expert (tensor-)parallel ranks hold other shards
        experts = experts.clone()
        torch.distributed.all_reduce(experts, group=ep_group)
    total = dense + experts
    if pp_group is not None:  # a stage without gradients still joins the sum
        torch.distributed.all_reduce(total, group=pp_group)
    norm = float(total.sqrt())
    if torch.isfinite(torch.tensor(norm)) and norm > max_norm:
        scale = max_norm / (norm + 1e-6)  # torch's clip_grad_norm_ epsilon
        for _, grad in grads:
            grad.mul_(scale)
    return norm
