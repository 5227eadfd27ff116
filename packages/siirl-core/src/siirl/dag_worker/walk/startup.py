"""Process start-up: cheaper garbage collection while libraries load, and the job's start.

Loading torch (with its compiler stack, which tensordict and the optimizer import),
transformers and their dependencies creates about 0.4 M objects that live as long as the
process. CPython's default thresholds (700, 10, 10) run a full collection each time the
heap has grown by a quarter, so the same objects are scanned again and again while they
load, and all of them once more at exit. Measured on the main job (2-core CPU machine):
about 1.3 s of CPU before the first step and 2 s at exit.

``relax()`` (by ``siirl-train`` and each worker process, before the heavy imports) raises
the young-generation threshold for the start-up: young garbage is still collected, only
less often. ``settle()`` (after the worker's set-up) moves everything alive then into the
permanent generation (``gc.freeze``), which later collections and the exit skip, and
restores the thresholds for training. Both change when objects are collected, never
what a run computes; ``settle()`` does nothing in a process that did not ``relax()``
(a test session, a notebook), whose objects are not ours to freeze.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Optional, Tuple

# young generation: ~1 collection per 50k net allocations instead of per 700; the old
# generation is left alone until set-up is over (measured: no garbage left behind)
STARTUP_THRESHOLDS = (50_000, 20, 100)

_IMPORTED_AT = time.time()
_saved: Optional[Tuple[int, int, int]] = None


def relax() -> None:
    """Fewer collections while the libraries load (until ``settle``)."""
    global _saved
    if _saved is None:
        _saved = gc.get_threshold()
        gc.set_threshold(*STARTUP_THRESHOLDS)


def settle() -> None:
    """Start-up is over: freeze what is alive, and collect as usual from now on."""
    global _saved
    if _saved is None:
        return
    gc.freeze()
    gc.set_threshold(*_saved)
    _saved = None


def process_started() -> float:
    """Wall-clock time (``time.time()``) at which this process started: from ``/proc`` on
    Linux, else when this module was first imported."""
    try:
        with open("/proc/self/stat") as f:
            # the command name (field 2) may hold spaces: count fields after its ')'
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT
