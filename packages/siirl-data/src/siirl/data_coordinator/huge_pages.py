"""Large CPU results on transparent huge pages, where the kernel hands them out on request.

Each fresh 4 KiB page of a new tensor costs a page fault: filling an 80 MB result takes
some 20,000 of them, which costs about as much as the copy itself. With transparent huge
pages in "madvise" mode (the common default), a mapping that asks for them takes one
fault per 2 MiB. The tensor owns its mapping (unmapped when the last view goes); its
storage cannot be resized, as with any tensor made by ``torch.frombuffer``. In "always"
mode ``torch.empty`` gets huge pages anyway, and in "never" mode asking is useless: both
keep ``torch.empty``.
"""

from __future__ import annotations

import functools
import math
import mmap
from pathlib import Path

import torch

__all__ = ["empty", "on_request"]

HUGE = 2 << 20
MIN_BYTES = 4 * HUGE  # below this the faults saved do not pay for a mapping of its own


@functools.cache
def on_request() -> bool:
    """True where huge pages are given to mappings that ask (THP "madvise" mode)."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[madvise]" in mode and hasattr(mmap, "MADV_HUGEPAGE")


def empty(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)``, on huge pages when large."""
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or nbytes < MIN_BYTES or not on_request():
        return torch.empty(shape, dtype=dtype, device=device)
    # One extra huge page of address space (never touched, so never allocated) lets the
    # tensor start on a 2 MiB boundary, where huge pages can back it from the first byte.
    area = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    area.madvise(mmap.MADV_HUGEPAGE)
    flat = torch.frombuffer(area, dtype=torch.uint8)
    start = -flat.data_ptr() % HUGE
    return flat.narrow(0, start, nbytes).view(dtype).view(shape)
