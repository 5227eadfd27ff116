"""Spawned test ranks (torch.multiprocessing.start_processes, join=False): waiting for
them (``join_spawned``) and ending one whose work went well (``finish_rank``).

The wait's limit is a hang guard, not a speed check: a loaded machine (another training job
beside the tests, any thread count) may run a rank many times slower, and only a rank that
never finishes should fail the test.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Any, NoReturn

import pytest

HANG_LIMIT_S = 900


def start_gloo_rank(rank: int, world_size: int, port: int, timeout_s: float = 60) -> None:
    """A spawned rank's start: library warnings off, one torch thread (the ranks share the
    machine's cores), and its gloo process group on ``port``."""
    import datetime
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))


def join_spawned(context: Any, what: str, limit_s: float = HANG_LIMIT_S) -> None:
    """Join every rank; a rank's exception is raised here by torch, a hang fails after
    ``limit_s`` with every rank killed."""
    deadline = time.monotonic() + limit_s
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{what} did not finish in {limit_s:g} s (a hang: killed)")


def finish_rank() -> NoReturn:
    """The last call of a spawned rank whose work went well: wait for every peer
    (``dist.barrier``: nobody tears down while a peer still talks to it), destroy the
    default process group, and end the process here, skipping the interpreter's teardown.

    Returning instead would run that teardown with gloo's threads still alive:
    ``destroy_process_group`` stops them only once nothing else holds the group, and
    DTensor's sharding cache keeps FSDP2's device mesh (so its group) to the end, as
    megatron keeps its own groups. The threads (and rank 0's TCPStore server) are then torn
    down in whatever order the interpreter's finalization frees objects, and a gloo thread
    that reaches into Python there aborts the rank after its work passed ("terminate called
    without an active exception", SIGABRT; pytorch/pytorch#65231, #190489). A rank that
    fails raises instead of calling this: torch.multiprocessing records its traceback
    before the process ends, so the test reports the error, whatever the teardown does.
    """
    import torch.distributed as dist

    if multiprocessing.parent_process() is None:
        raise RuntimeError("finish_rank() ends the process: call it in a spawned rank only")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
