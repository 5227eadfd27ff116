"""Data parallelism by replication (``fsdp_config.fsdp_size=1``): every rank holds the whole
module and its optimizer; gradients are averaged in one flat all-reduce per optimizer step.

For a model that fits one device this is DDP without the wrapper: no per-layer all-gathers
in the forward, no per-layer reduce-scatters in the backward, one collective per update.
The ranks start from rank 0's weights and take identical optimizer steps on identical
averaged gradients, so they stay equal without further communication.
"""

from __future__ import annotations

from typing import Any, List

import torch
import torch.distributed as dist


def _trainable(module: torch.nn.Module) -> List[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def broadcast_parameters(module: torch.nn.Module, group: Any = None) -> None:
    """Copy the group's first rank's parameters and buffers to every rank (one flat
    broadcast), so replicas start equal even when their initialisation differed."""
    tensors = [t.data for t in list(module.parameters()) + list(module.buffers())]
    if not tensors:
        return
    flat = torch._utils._flatten_dense_tensors(tensors)
    dist.broadcast(flat, src=dist.get_global_rank(group or dist.group.WORLD, 0), group=group)
    for tensor, synced in zip(tensors, torch._utils._unflatten_dense_tensors(flat, tensors),
                              strict=True):
        tensor.copy_(synced)


def average_gradients(module: torch.nn.Module, group: Any = None) -> None:
    """Average the trainable parameters' gradients over ``group`` in place.

    A parameter without a gradient on this rank contributes zeros (and then holds the
    average), so every rank reduces the same flat buffer and none can wait forever."""
    params = _trainable(module)
    if not params:
        return
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    grads = [p.grad for p in params]
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    flat.div_(dist.get_world_size(group))
    for grad, averaged in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads),
                              strict=True):
        grad.copy_(averaged)
