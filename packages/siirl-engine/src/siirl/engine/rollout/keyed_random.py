"""Counter-based random numbers: a uniform in [0, 1) per (row key, draw) pair.

Sampling a response must not depend on which worker holds the prompt or on what else is in
its batch, or a run on N workers would differ from the run on one. So each row gets its
own stream: ``uniforms(keys, draw)`` hashes a 64-bit row key with the draw counter
(SplitMix64's finaliser, vectorised over int64 tensors whose products wrap modulo 2**64).
The same key and draw give the same number on any worker, batch size or device.
"""

from __future__ import annotations

import torch

__all__ = ["mix", "row_keys", "uniforms"]

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_M1 = _signed(0xBF58476D1CE4E5B9)
_M2 = _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic on negative values)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _finalise(x: torch.Tensor) -> torch.Tensor:
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def mix(keys: torch.Tensor, value: int | torch.Tensor) -> torch.Tensor:
    """A new int64 key from ``keys`` and ``value`` (an int or a tensor broadcasting to it)."""
    if isinstance(value, int):
        value = _signed(value)
    return _finalise(keys.to(torch.int64) + _GOLDEN * (torch.as_tensor(value) + 1))


def row_keys(base: int, ids: torch.Tensor, *salts: int | torch.Tensor) -> torch.Tensor:
    """One key per row from a run-wide ``base`` (e.g. the seed), the rows' ``ids`` and any
    further salts (step, call, sample index within the group)."""
    keys = mix(torch.full_like(ids, _signed(base), dtype=torch.int64), ids.to(torch.int64))
    for salt in salts:
        keys = mix(keys, salt)
    return keys


def uniforms(keys: torch.Tensor, draw: int) -> torch.Tensor:
    """Float64 uniforms in [0, 1), one per key, for draw number ``draw``."""
    bits = _shr(mix(keys, draw), 11)  # the top 53 bits: a float64's mantissa
    return bits.to(torch.float64) / float(1 << 53)
