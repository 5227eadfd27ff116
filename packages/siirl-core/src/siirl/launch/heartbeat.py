"""Heartbeats of a multi-worker job: which worker stopped responding, and doing what.

A worker blocked in a collective with a stopped (SIGSTOP), hung or livelocked peer would
wait out ``trainer.dist_timeout_s`` and then report its *own* collective timeout. So each
worker runs a daemon thread that reports every ``INTERVAL_S`` seconds to a small monitor
actor (no CPU reserved): rank, pid, host, step and what it runs (``siirl.dag_worker.
activity``). The thread beats while its worker computes or waits in a collective (both
release the GIL); it stops only when the process does. The driver asks the monitor between
its waits; a worker silent for ``trainer.heartbeat_timeout_s`` ends the job with an error
naming it. Ages are measured on the monitor's clock, so hosts' clocks need not agree.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional

INTERVAL_S = 2.0
CHECK_S = 5.0  # how often the driver looks


class HeartbeatMonitor:
    """Ray actor: the last beat of every rank (``time.monotonic()`` of its arrival)."""

    def __init__(self) -> None:
        self._beats: Dict[int, tuple] = {}

    def beat(self, rank: int, info: dict) -> None:
        self._beats[int(rank)] = (time.monotonic(), dict(info))

    def silent(self, timeout_s: float) -> List[dict]:
        """The ranks whose last beat is older than ``timeout_s``: their last info plus
        ``silent_s``, the oldest first."""
        now = time.monotonic()
        late = [dict(info, rank=rank, silent_s=now - at)
                for rank, (at, info) in self._beats.items() if now - at > timeout_s]
        return sorted(late, key=lambda info: -info["silent_s"])


def describe(info: dict) -> str:
    """One line: who stopped responding, since when, doing what."""
    doing = info.get("running") or "nothing (between nodes)"
    step = info.get("step")
    at_step = f" at step {step}" if step is not None else ""
    return (f"worker rank {info['rank']} (pid {info.get('pid')} on {info.get('host')}) "
            f"stopped responding {info['silent_s']:.0f} s ago while running {doing}"
            f"{at_step}")


class Beater:
    """The worker's side: a daemon thread reporting to the monitor until stopped."""

    def __init__(self, monitor: Any, rank: int, step: Callable[[], Optional[int]],
                 interval_s: float = INTERVAL_S):
        self.monitor, self.rank, self.step, self.interval_s = monitor, rank, step, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="siirl-heartbeat",
                                        daemon=True)

    def info(self) -> dict:
        from siirl.dag_worker.walk import activity

        running, since = activity.current()
        try:
            step = self.step()
        except Exception:  # the worker is still being built
            step = None
        return {"pid": os.getpid(), "host": socket.gethostname(), "running": running,
                "running_for_s": round(time.time() - since, 1) if running else None,
                "step": step}

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.monitor.beat.remote(self.rank, self.info())
            except Exception:  # the monitor is gone: the job is ending
                return
            self._stop.wait(self.interval_s)

    def start(self) -> Beater:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
