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


FSDP_SIZE_HINT = ("-1 (shard every layer over all of the role's workers, the default) or 1 "
                  "(every worker holds the whole model; gradients are averaged once per "
                  "update, which is faster for a model that fits one device)")


def replicates(fsdp_size: Any, world: int, key: str) -> bool:
    """Whether ``fsdp_size`` (``key``) asks for replication rather than sharding over the
    ``world`` ranks of a role; hybrid sizes between 1 and ``world`` are refused."""
    try:
        size = int(fsdp_size)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={fsdp_size!r} is not an integer; use {FSDP_SIZE_HINT}."
                          ) from None
    if size in (-1, world):
        return False
    if size == 1:
        return True
    if size < 1:
        raise ConfigError(f"{key}={size} is not a group size; use {FSDP_SIZE_HINT}.")
    raise ConfigError(f"{key}={size} asks for hybrid sharding (HSDP) over groups of {size} "
                      f"of the {world} workers, which the fsdp engine does not support; use "
                      f"{FSDP_SIZE_HINT}.")


def shard_fsdp2(module: torch.nn.Module, reshard_after_forward: bool = True,
                group: Any = None, offload: bool = False) -> torch.nn.Module:
    """``fully_shard`` every decoder layer, then the root (embeddings, norm, head), over the
    ranks of ``group`` (default: the world) on the module's device type; ``offload``: with
    FSDP2's CPU offload (``siirl.engine.fsdp.offload``)."""
    try:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
    except ImportError as exc:  # torch < 2.6 exposes FSDP2 elsewhere or not at all
        raise ConfigError(f"data-parallel training needs FSDP2 (torch.distributed.fsdp."
                          f"fully_shard), missing in torch {torch.__version__}") from exc
    device_type = next(module.parameters()).device.type
    mesh = DeviceMesh.from_group(group or torch.distributed.group.WORLD, device_type)
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if offload:
        from siirl.engine.fsdp.offload import offload_policy

        kwargs["offload_policy"] = offload_policy()
    for layer in decoder_layers(module):
        fully_shard(layer, **kwargs)
    fully_shard(module, **kwargs)
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
