"""Which device a worker computes on, from ``trainer.device`` (auto | cuda | cpu)."""

from __future__ import annotations

from typing import Any

from siirl.errors import ConfigError
from siirl.execution.config_select import select

DEVICES = ("auto", "cuda", "cpu")


def device_kind(config: Any) -> str:
    """"cuda" or "cpu": ``auto`` means CUDA when this process sees a GPU."""
    name = str(select(config, "trainer.device", "auto") or "auto").lower()
    if name not in DEVICES:
        raise ConfigError(f"trainer.device={name!r} is not supported; choose one of "
                          f"{', '.join(DEVICES)}")
    if name == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def resolve_device(config: Any) -> Any:
    """The torch.device this worker's engines use (a Ray GPU worker sees one GPU, cuda:0)."""
    import torch

    kind = device_kind(config)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("trainer.device=cuda but this worker sees no GPU; use "
                              "trainer.device=cpu or check CUDA_VISIBLE_DEVICES")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
