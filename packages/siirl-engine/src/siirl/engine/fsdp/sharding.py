"""Sharding torch modules with FSDP2 (``fully_shard``)."""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from siirl.errors import ConfigError


def decoder_layers(module: torch.nn.Module) -> list:
    """The repeated blocks to shard one by one."""
    # HF models name their repeated block classes in _no_split_modules; anything else is
    # sharded per entry of its ModuleLists named like a layer stack.
    names = set(getattr(module, "_no_split_modules", None) or ())
    layers = [m for m in module.modules() if type(m).__name__ in names]
    if layers:
        return layers
    return [layer for name, child in module.named_modules()
            if isinstance(child, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in
            ("layers", "h", "blocks") for layer in child]


def shard_fsdp2(module: torch.nn.Module, reshard_after_forward: bool = True,
                group: Any = None) -> torch.nn.Module:
    """``fully_shard`` every decoder layer, then the root (embeddings, norm, head), over the
    ranks of ``group`` (default: the world) on the module's device type."""
    try:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
    except ImportError as exc:  # torch < 2.6 exposes FSDP2 elsewhere or not at all
        raise ConfigError(f"data-parallel training needs FSDP2 (torch.distributed.fsdp."
                          f"fully_shard), missing in torch {torch.__version__}") from exc
    device_type = next(module.parameters()).device.type
    mesh = DeviceMesh.from_group(group or torch.distributed.group.WORLD, device_type)
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return module


def fix_architectures(directory: str, module: torch.nn.Module) -> None:
    """FSDP2 swaps the module's class for a generated "FSDP<Name>" subclass; older
    transformers would write that name into config.json, which nothing can load."""
    path = os.path.join(directory, "config.json")
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule) or not os.path.exists(path):
        return  # not sharded, or a model without a config.json (nothing to fix)
    base = next(c for c in type(module).__mro__[1:] if not issubclass(c, FSDPModule))
    with open(path) as handle:
        config = json.load(handle)
    config["architectures"] = [base.__name__]
    with open(path, "w") as handle:
        json.dump(config, handle, indent=2)
