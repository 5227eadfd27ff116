"""Reward worker processes that score batches, from the trainer's side.

The user's reward function runs in ``worker_main`` processes that outlive a call, so the
interpreter start and the import of the user's file are paid once, and each call scores
a whole chunk of samples. Whatever the function does there (raise, ``sys.exit``,
``os._exit``, a signal, a segfault, hang) costs only the sample it was scoring:

* in ``rows`` mode the worker answers per sample, in order, so the sample in flight is
  the first unanswered one. A worker that dies, or gives no answer within ``timeout_s``
  of the previous one, is killed; that sample fails (``exit``, ``crash``, ``timeout``)
  and the rest of its chunk goes to a fresh worker;
* ``call_batch`` runs one call of a ``batch`` function and reports how it failed; the
  batch manager splits failing calls (``batch.isolate``).

This module imports no torch.
"""

from __future__ import annotations

import time
from collections import deque
from multiprocessing.connection import wait
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from siirl.engine.reward_manager._process import START_TIMEOUT_S, ScoringProcess, Target
from siirl.engine.reward_manager.outcome import Failure, Outcome, Row
from siirl.errors import ConfigError

__all__ = ["RewardWorkerPool", "ScoringProcess", "Target"]


class RewardWorkerPool:
    """``num_workers`` worker processes, started on first use, replaced when they die."""

    def __init__(self, target: Target, num_workers: int, timeout_s: float):
        self.target = target
        self.timeout_s = float(timeout_s)
        self._slots: List[Optional[ScoringProcess]] = [None] * max(1, int(num_workers))

    def start(self) -> None:
        """Start the first worker and wait until it has loaded the function, so a reward
        file that fails to import fails when the engine is built, not mid-step."""
        try:
            self._process(0).await_ready()
        except BaseException:
            self.close(graceful=False)
            raise

    def _process(self, i: int) -> ScoringProcess:
        process = self._slots[i]
        if process is None or (process.ready and not process.alive()):
            if process is not None:
                process.kill()
            process = self._slots[i] = ScoringProcess(self.target)
        return process

    def _drop(self, i: int) -> None:
        process, self._slots[i] = self._slots[i], None
        if process is not None:
            process.kill()

    # --- rows mode ---

    def score_rows(self, rows: Sequence[Row], deadline: float) -> List[Outcome]:
        """One outcome per row, by the deadline (``time.monotonic()``)."""
        try:
            return self._score_rows(rows, deadline)
        except BaseException:
            self.close(graceful=False)  # answers in flight would reach the next call
            raise

    def _score_rows(self, rows: Sequence[Row], deadline: float) -> List[Outcome]:
        n, slots = len(rows), len(self._slots)
        out: List[Any] = [None] * n
        # one call per worker where there is one worker; else several, to balance the load
        size = n if slots == 1 else max(1, -(-n // (4 * slots)))
        pending: Deque[Tuple[int, int]] = deque((lo, min(lo + size, n))
                                                for lo in range(0, n, size))
        jobs: Dict[int, List[Any]] = {}  # slot -> [next row, end, its deadline]
        while pending or jobs:
            now = time.monotonic()
            if now >= deadline:
                self._out_of_time(out, pending, jobs)
                break
            for i in range(slots):
                if pending and i not in jobs:
                    self._hand_out(i, rows, out, pending, jobs, now)
            waiting = {p.results: i for i, p in enumerate(self._slots)
                       if p is not None and (i in jobs or not p.ready)}
            if not waiting:  # a worker found dead while idle: start its successor
                continue
            limits = [deadline, *(job[2] for job in jobs.values()),
                      *(p.started + START_TIMEOUT_S for p in self._slots
                        if p is not None and not p.ready)]
            for conn in wait(list(waiting), max(0.0, min(limits) - now)):
                self._on_message(waiting[conn], out, pending, jobs)
            now = time.monotonic()
            for i, job in list(jobs.items()):
                if now >= job[2]:
                    self._fail_current(i, out, pending, jobs, Failure(
                        "timeout", f"no result within timeout_s={self.timeout_s:g} s; the "
                                   "reward worker process was killed and restarted"))
            for p in self._slots:
                if p is not None and not p.ready and now >= p.started + START_TIMEOUT_S:
                    p.await_ready()  # raises the start-up timeout
        return out

    def _hand_out(self, i: int, rows: Sequence[Row], out: List[Any],
                  pending: Deque[Tuple[int, int]], jobs: Dict[int, List[Any]],
                  now: float) -> None:
        process = self._process(i)
        if not process.ready:
            return
        lo, hi = pending.popleft()
        try:
            process.tasks.send(("rows", list(rows[lo:hi])))
        except (OSError, EOFError):  # it died while idle: no sample to blame
            pending.appendleft((lo, hi))
            self._drop(i)
            return
        except Exception as exc:  # a row that cannot be pickled; nothing was written
            if hi - lo > 1:  # find it: send the rows one by one
                pending.extendleft(reversed([(r, r + 1) for r in range(lo, hi)]))
            else:
                out[lo] = Failure("exception", "the sample cannot be sent to the reward "
                                               f"worker process ({type(exc).__name__}: {exc})")
            return
        jobs[i] = [lo, hi, now + self.timeout_s]

    def _on_message(self, i: int, out: List[Any], pending: Deque[Tuple[int, int]],
                    jobs: Dict[int, List[Any]]) -> None:
        process = self._slots[i]
        if not process.ready:
            process.on_start_message()
            return
        try:
            message = process.receive()
        except EOFError:
            self._fail_current(i, out, pending, jobs, process.death())
            return
        if isinstance(message, tuple) and message[0] == "config_error":
            raise ConfigError(message[1])
        job = jobs[i]
        out[job[0]] = message
        job[0] += 1
        job[2] = time.monotonic() + self.timeout_s  # the next sample's clock starts now
        if job[0] == job[1]:
            del jobs[i]

    def _fail_current(self, i: int, out: List[Any], pending: Deque[Tuple[int, int]],
                      jobs: Dict[int, List[Any]], failure: Failure) -> None:
        """The sample in flight on slot ``i`` failed: the rest of its chunk is re-queued."""
        row, end, _ = jobs.pop(i)
        out[row] = failure
        if row + 1 < end:
            pending.appendleft((row + 1, end))
        self._drop(i)

    def _out_of_time(self, out: List[Any], pending: Deque[Tuple[int, int]],
                     jobs: Dict[int, List[Any]]) -> None:
        spans = [(job[0], job[1]) for job in jobs.values()] + list(pending)
        for i in list(jobs):
            self._drop(i)
        jobs.clear()
        pending.clear()
        failure = Failure("timeout", "the step's time for rewards (reward_model.step_timeout_s) "
                                     "ran out before this sample was scored")
        for lo, hi in spans:
            out[lo:hi] = [failure] * (hi - lo)

    # --- batch mode ---

    def call_batch(self, rows: Sequence[Row], deadline: float) -> Any:
        """One call of a batch function in worker 0: a list of outcomes, a Failure of the
        whole call, or ``("bad_result", message)``."""
        try:
            process = self._process(0)
            process.await_ready()
            until = min(deadline, time.monotonic() + self.timeout_s)
            try:
                process.tasks.send(("batch", list(rows)))
            except (OSError, EOFError):
                failure = process.death()
                self._drop(0)
                return failure
            except Exception as exc:  # a row that cannot be pickled: the caller splits
                return Failure("exception", "the samples cannot be sent to the reward worker "
                                            f"process ({type(exc).__name__}: {exc})")
            if not wait([process.results], max(0.0, until - time.monotonic())):
                self._drop(0)
                return Failure("timeout", f"no result within timeout_s={self.timeout_s:g} s "
                                          "(or the step's time ran out); the reward worker "
                                          "process was killed and restarted")
            try:
                message = process.receive()
            except EOFError:
                failure = process.death()
                self._drop(0)
                return failure
        except BaseException:
            self.close(graceful=False)
            raise
        if isinstance(message, tuple) and message[0] == "config_error":
            raise ConfigError(message[1])
        return message

    def close(self, graceful: bool = True) -> None:
        """Stop every worker process (a later call starts fresh ones); ``graceful`` lets
        idle ones exit on their own first."""
        for i, process in enumerate(self._slots):
            if process is not None:
                self._slots[i] = None
                process.close() if graceful else process.kill()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass  # interpreter shutdown: atexit kills what is left
