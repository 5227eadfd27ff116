"""CPU offload of FSDP2-sharded modules: verl's ``fsdp_config.param_offload``,
``optimizer_offload`` and ``offload_policy``.

FSDP2 has one offload, ``CPUOffloadPolicy``: the parameter shards, their gradients and so
the optimizer state (built on those parameters) live in host memory, and each layer is
copied to the device for its forward and backward; the optimizer steps on the CPU. So every
one of the three keys turns on that same policy: ``optimizer_offload`` alone (verl moves
only the optimizer state, between steps) offloads the parameters as well.

The shards then sit on the CPU while collectives run on the device's backend (NCCL), so the
gradient norm is summed on the device (:func:`clip_grad_norm`) rather than through the
CPU DTensors, which NCCL cannot reduce.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from siirl.engine.common.runtime import ensure_distributed
from siirl.engine.fsdp.config import OFFLOAD_ON_CPU, offload_of_whole_module
from siirl.errors import ConfigError

__all__ = ["KEYS", "asked", "clip_grad_norm", "offload_policy", "wants_offload"]

KEYS = ("param_offload", "optimizer_offload", "offload_policy")


def asked(fsdp_config: Any) -> list:
    """The offload keys ``fsdp_config`` sets."""
    return [k for k in KEYS if bool(getattr(fsdp_config, k, False))]


def wants_offload(fsdp_config: Any, prefix: str, device: Optional[torch.device],
                  replicated: bool) -> bool:
    """Whether ``fsdp_config`` (under ``prefix``) asks for CPU offload; refuses it where it
    cannot act: on a CPU run, or with a module replicated whole (``fsdp_size=1``)."""
    keys = asked(fsdp_config)
    if not keys:
        return False
    key = f"{prefix}.{keys[0]}"
    if torch.device(device).type == "cpu":
        # the validation pass refuses this before loading where the workers run on the
        # launching machine; here for workers elsewhere and engines built directly
        raise ConfigError(f"{key}=true: {OFFLOAD_ON_CPU}")
    if replicated:
        raise ConfigError(offload_of_whole_module(prefix, keys[0]))
    ensure_distributed()  # FSDP2 shards (and so offloads) even a lone worker's module
    return True


def offload_policy() -> Any:
    """FSDP2's CPU offload (pinned host memory: faster copies to the device)."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    return CPUOffloadPolicy(pin_memory=True)


def clip_grad_norm(module: torch.nn.Module, clip: Any, group: Any,
                   device: torch.device) -> float:
    """Clip the gradients of an offloaded FSDP2 module (shards on the CPU, sharded over
    ``group``) to ``clip`` (<= 0 or None: measure only); the global norm."""
    grads = [p.grad for p in module.parameters() if p.requires_grad and p.grad is not None]
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    squares = torch.zeros((), dtype=torch.float64)
    for grad in local:
        squares += grad.detach().double().pow(2).sum()
    squares = squares.to(device)
    torch.distributed.all_reduce(squares, group=group)  # every shard once
    norm = float(squares.sqrt())
    max_norm = float(clip) if clip and clip > 0 else float("inf")
    if math.isfinite(norm) and norm > max_norm:
        scale = max_norm / (norm + 1e-6)  # torch's clip_grad_norm_ epsilon
        for grad in local:
            grad.mul_(scale)
    return norm
