"""Which device a worker computes on, from ``trainer.device`` (one of ``DEVICES``)."""

from __future__ import annotations

from typing import Any, Optional

from siirl.errors import ConfigError
from siirl.params import SiiRLArguments
from siirl.params.training_args import DEVICES  # the values of trainer.device


def device_kind(config: SiiRLArguments) -> str:
    """"cuda" or "cpu": ``auto`` means CUDA when this process sees a GPU."""
    name = str(config.trainer.device).lower()
    if name not in DEVICES:
        raise ConfigError(f"trainer.device={name!r} is not supported; choose one of "
                          f"{', '.join(DEVICES)}")
    if name == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def resolve_device(config: SiiRLArguments) -> Any:
    """The torch.device this worker's engines use (a Ray GPU worker sees one GPU, cuda:0)."""
    import torch

    kind = device_kind(config)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("trainer.device=cuda but this worker sees no GPU; use "
                              "trainer.device=cpu or check CUDA_VISIBLE_DEVICES")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# Dense peak FLOP/s (TFLOP/s) of one GPU by dtype, datasheet values, for model-FLOPs-use
# estimates. A device not listed (a CPU, an unknown GPU) has no MFU, never a made-up one.
PEAK_TFLOPS = {"H200": {"fp32": 67.0, "bf16": 989.0}, "H100": {"fp32": 67.0, "bf16": 989.0},
               "A100": {"fp32": 19.5, "bf16": 312.0}}


def peak_tflops(device_name: str, dtype: str = "fp32") -> Optional[float]:
    """The peak of the first ``PEAK_TFLOPS`` entry named in ``device_name``, or None."""
    for gpu, peaks in PEAK_TFLOPS.items():
        if gpu in str(device_name):
            return peaks.get(dtype)
    return None


def model_flops_use(flops_per_s: float, device_name: str, dtype: str = "fp32") -> Optional[float]:
    """Achieved / peak FLOP/s, or None where the device's peak is unknown."""
    peak = peak_tflops(device_name, dtype)
    return flops_per_s / (peak * 1e12) if peak else None


def format_mfu(mfu: Optional[float], device_name: str) -> str:
    return f"{mfu:.2%}" if mfu is not None else f"n/a (no known peak FLOP/s for {device_name})"
