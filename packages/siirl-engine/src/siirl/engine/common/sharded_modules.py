"""Helpers for modules sharded with FSDP2 (``fully_shard``)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


def fsdp_modules(module: torch.nn.Module) -> list:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2: nothing can be sharded
        return []
    return [m for m in module.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def full_weights(module: torch.nn.Module,
                 reshard_after_forward: bool = True) -> Iterator[torch.nn.Module]:
    """Every FSDP2 unit of ``module`` unsharded for the duration (one all-gather each, on
    entry, collective over the module's ranks); plain modules pass through.

    Generation needs this: each rank decodes its own rows for as many steps as they take,
    so ranks run different numbers of forwards. With the weights gathered up front those
    forwards are local and need no lockstep with the other ranks. Afterwards the units
    are resharded and get ``reshard_after_forward`` (the engine's setting) back.
    """
    units = fsdp_modules(module)
    if not units:
        yield module
        return
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield module
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(reshard_after_forward, recurse=False)
