"""Where an engine runs: its device, its data-parallel rank and size, its process group."""

from __future__ import annotations

from typing import Any, Tuple

import torch

from siirl.execution.device import resolve_device

__all__ = ["data_parallel_world", "ensure_distributed", "module_device", "process_group",
           "resolve_device", "should_shard"]


def data_parallel_world(worker: Any) -> Tuple[int, int]:
    """(rank, data-parallel size) from the worker, else from torch.distributed."""
    if worker is not None:
        return int(getattr(worker, "rank", 0)), int(getattr(worker, "world_size", 1))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def process_group(worker: Any, role: str) -> Any:
    """The worker's process group for ``role`` (None: the default group)."""
    lookup = getattr(worker, "process_group", None)
    return lookup(role) if callable(lookup) else None


def ensure_distributed() -> None:
    """A world of one (NCCL with CUDA, else gloo) when this worker runs alone and something
    needs torch.distributed: megatron's parallel state, FSDP2's CPU offload. Multi-worker
    jobs are initialised by the launcher. The group is destroyed at exit."""
    import atexit

    import torch.distributed as dist

    from siirl.execution.scheduler.process_group_manager import free_port

    if dist.is_initialized():
        return
    port = free_port()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())


def should_shard(group: Any = None) -> bool:
    """True when ``group`` (default: the world) has more than one rank."""
    return (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size(group) > 1)


def module_device(module: torch.nn.Module) -> torch.device:
    """Where ``module`` computes: its parameters' device, except under FSDP2's CPU offload,
    whose shards live on the CPU while the module computes on its mesh's device."""
    param = next(module.parameters())
    mesh = getattr(param, "device_mesh", None)
    if mesh is not None and mesh.device_type != param.device.type:
        return torch.device(mesh.device_type)
    return param.device
