"""Waiting for spawned test ranks (torch.multiprocessing.start_processes, join=False).

The limit is a hang guard, not a speed check: a loaded machine (another training job
beside the tests, any thread count) may run a rank many times slower, and only a rank that
never finishes should fail the test.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

HANG_LIMIT_S = 900


def join_spawned(context: Any, what: str, limit_s: float = HANG_LIMIT_S) -> None:
    """Join every rank; a rank's exception is raised here by torch, a hang fails after
    ``limit_s`` with every rank killed."""
    deadline = time.monotonic() + limit_s
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{what} did not finish in {limit_s:g} s (a hang: killed)")
