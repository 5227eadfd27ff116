"""What this worker process is doing right now: the node it runs (or None between nodes)
and since when. Read by the heartbeat thread (``siirl.launch.heartbeat``), so a worker
that stops responding is reported with what it was running."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Optional, Tuple

_current: Tuple[Optional[str], float] = (None, time.time())


@contextmanager
def running(what: str) -> Iterator[None]:
    """Mark ``what`` (e.g. "node 'actor_train'") as running for the ``with`` block."""
    global _current
    previous = _current
    _current = (what, time.time())
    try:
        yield
    finally:
        _current = previous


def current() -> Tuple[Optional[str], float]:
    """``(what, since)``: what runs (None when idle) and its start (``time.time()``)."""
    return _current
