"""Stand-ins for ``torch`` inside megatron-core modules on the CPU: the real torch except
that the current CUDA device names the CPU (and, for some modules, that ``device="cuda"``
allocations land on the CPU). Bound into megatron's modules by the CPU adapters
(:mod:`siirl.engine.megatron.cpu_compat`, :mod:`siirl.engine.megatron.cpu_compat_moe`)."""

from __future__ import annotations

import torch

__all__ = ["CPU_TORCH", "CPU_TORCH_NO_CUDA_DEVICE", "CpuCuda", "CpuTorch"]


class CpuCuda:
    """Stands in for ``torch.cuda`` inside one megatron module: every attribute is the real
    one except ``current_device()``, which names the CPU, and ``synchronize()``, a no-op
    (CPU copies are synchronous: there is no stream to wait for)."""

    def __getattr__(self, name):
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def synchronize(device=None) -> None:
        return None


class CpuTorch:
    """Stands in for the ``torch`` module inside one megatron module (cpu_compat's
    _CURRENT_DEVICE_USERS): everything is the real torch (``torch.Tensor`` is the same class,
    so ``isinstance`` checks hold) except ``torch.cuda.current_device()``."""

    cuda = CpuCuda()

    def __getattr__(self, name):
        return getattr(torch, name)


CPU_TORCH = CpuTorch()


def cpu_factory(name: str):
    factory = getattr(torch, name)

    def make(*args, device=None, **kwargs):
        if device is not None and torch.device(device).type == "cuda":
            device = "cpu"
        return factory(*args, device=device, **kwargs)

    make.__name__ = name
    return make


class CpuTorchNoCudaDevice(CpuTorch):
    """CpuTorch whose tensor factories also turn an explicit ``device="cuda"`` into the CPU
    (for cpu_compat's _CUDA_STRING_USERS): the same tensor, allocated where every other
    tensor of the CPU run lives."""

    zeros = staticmethod(cpu_factory("zeros"))
    ones = staticmethod(cpu_factory("ones"))
    empty = staticmethod(cpu_factory("empty"))
    tensor = staticmethod(cpu_factory("tensor"))


CPU_TORCH_NO_CUDA_DEVICE = CpuTorchNoCudaDevice()
