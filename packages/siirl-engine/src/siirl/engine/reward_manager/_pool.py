"""Worker processes that score rows with a per-row deadline.

``concurrent.futures.ProcessPoolExecutor`` cannot stop a running task, so a user function
that never returns would hold the step forever. Here each worker is a plain ``spawn``
process fed one row at a time over its own pipe; the parent knows when each row was
handed out, and a worker that misses its deadline is killed and replaced, costing only
that row. Workers outlive a call (start-up is paid once) and are daemons, so they die
with the trainer.

This module imports no torch: spawned workers import it (and this package) afresh.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import deque
from multiprocessing.connection import wait
from typing import Any, List, Optional, Sequence, Tuple

from siirl.errors import ConfigError

# spawn, not fork: the trainer holds torch threads and CUDA state that a fork would
# copy in an inconsistent state.
_CTX = mp.get_context("spawn")
# Importing the user's module in a fresh interpreter can be slow (it may import torch);
# this bounds it without counting it against any row's timeout.
START_TIMEOUT_S = 120.0

# What a worker runs: ("default",) for the built-in rules, ("path", file, name, kwargs)
# for a custom function (loaded in the worker, so it needs no pickling), or
# ("callable", fn, kwargs) for an importable module-level function.
Target = Tuple[Any, ...]


def _resolve(target: Target):
    if target[0] == "default":
        from siirl.engine.reward_score import default_compute_score

        return default_compute_score, {}
    if target[0] == "path":
        from siirl.engine.reward_manager.loader import load_custom_function

        return load_custom_function(target[1], target[2]), dict(target[3])
    return target[1], dict(target[2])


def _worker_main(conn: Any, target: Target) -> None:
    try:
        fn, kwargs = _resolve(target)
    except Exception as exc:
        conn.send(("load_error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except EOFError:  # the parent went away
            return
        if task is None:
            return
        data_source, solution, ground_truth, extra_info = task
        try:
            reply = ("ok", fn(data_source=data_source, solution_str=solution,
                              ground_truth=ground_truth, extra_info=extra_info, **kwargs))
        except ConfigError as exc:  # a setup problem: the parent raises it after the call
            reply = ("config_error", str(exc))
        except Exception as exc:
            reply = ("error", f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)  # pickles before writing, so a failure leaves the pipe clean
        except Exception as exc:
            conn.send(("error", f"result cannot be sent back: {type(exc).__name__}: {exc}"))


class _Worker:
    def __init__(self, target: Target):
        self.conn, child_conn = _CTX.Pipe()
        self.process = _CTX.Process(target=_worker_main, args=(child_conn, target),
                                    daemon=True, name="siirl-reward-worker")
        self.process.start()
        child_conn.close()  # so the parent sees EOF when the worker dies
        self.started = time.monotonic()
        self.ready = False
        self.row: Optional[int] = None
        self.deadline = 0.0

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class RewardWorkerPool:
    """``run(tasks)`` -> one ``(status, value)`` per task: ``("ok", result)``,
    ``("error", message)``, ``("timeout", message)`` or ``("config_error", message)``."""

    def __init__(self, target: Target, num_workers: int, timeout_s: float):
        self.target = target
        self.num_workers = max(1, int(num_workers))
        self.timeout_s = float(timeout_s)
        self._workers: List[_Worker] = []

    def run(self, tasks: Sequence[Tuple[Any, Any, Any, Any]]) -> List[Tuple[str, Any]]:
        try:
            return self._run(tasks)
        except BaseException:
            # Rows still in flight would answer into the next call: start afresh instead.
            self.close()
            raise

    def _run(self, tasks: Sequence[Tuple[Any, Any, Any, Any]]) -> List[Tuple[str, Any]]:
        results: List[Optional[Tuple[str, Any]]] = [None] * len(tasks)
        pending = deque(range(len(tasks)))
        while len(self._workers) < min(self.num_workers, len(tasks)):
            self._workers.append(_Worker(self.target))
        while pending or any(w.row is not None for w in self._workers):
            now = time.monotonic()
            for w in self._workers:
                while w.ready and w.row is None and pending:
                    row = pending.popleft()
                    try:
                        w.conn.send(tasks[row])  # pickles first: a bad row leaves w idle
                    except OSError:  # it died while idle: give the row to its successor
                        pending.appendleft(row)
                        self._replace(w, results, "error", "")  # w.row is None: no result
                        break
                    except Exception as exc:
                        results[row] = ("error", f"row cannot be sent to a worker: {exc}")
                        continue
                    w.row, w.deadline = row, now + self.timeout_s  # per row, from hand-out
            waiting = {w.conn: w for w in self._workers if not w.ready or w.row is not None}
            if not waiting:  # every remaining row failed to send: nothing to wait for
                continue
            deadlines = [w.deadline if w.ready else w.started + START_TIMEOUT_S
                         for w in waiting.values()]
            for conn in wait(list(waiting), max(0.0, min(deadlines) - now)):
                self._receive(waiting[conn], results)
            now = time.monotonic()
            for w in list(self._workers):
                if w.row is not None and now >= w.deadline:
                    self._replace(w, results, "timeout",
                                  f"no result within {self.timeout_s:g}s; worker killed")
                elif not w.ready and now >= w.started + START_TIMEOUT_S:
                    raise ConfigError(f"reward worker did not start within {START_TIMEOUT_S:g}s "
                                      "(importing the custom reward function hangs?)")
        return results  # type: ignore[return-value]

    def _receive(self, w: _Worker, results: List[Any]) -> None:
        try:
            kind, value = w.conn.recv()
        except (EOFError, OSError):
            w.process.join(timeout=1)  # reap it, so exitcode says how it died
            if not w.ready:  # would fail the same way on every restart
                raise ConfigError("reward worker process exited while starting (exit code "
                                  f"{w.process.exitcode})") from None
            self._replace(w, results, "error",
                          f"worker process died (exit code {w.process.exitcode})")
            return
        if kind == "ready":
            w.ready = True
        elif kind == "load_error":
            raise ConfigError(f"reward worker could not load the reward function: {value}")
        else:
            results[w.row] = (kind, value)
            w.row = None

    def _replace(self, w: _Worker, results: List[Any], kind: str, message: str) -> None:
        if w.row is not None:
            results[w.row] = (kind, message)
        w.kill()
        self._workers[self._workers.index(w)] = _Worker(self.target)

    def close(self) -> None:
        workers, self._workers = self._workers, []
        for w in workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in workers:
            w.process.join(timeout=1)
            w.kill()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass  # interpreter shutdown: daemon workers are reaped by multiprocessing

