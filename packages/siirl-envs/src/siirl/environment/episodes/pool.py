"""The environment process pool every episode loop shares: environments in worker
processes, so one that hangs, crashes or is slow cannot stall or take down the training
worker.

Each process hosts a table of objects (environments) by id: one built when the process
starts (``factories[i]``, rebuilt on a restart) and any made later by a ``create`` call.
A round of calls is sent to every process first, then the answers are collected against
one deadline per process (``step_timeout_s``; a fresh process's first answer waits at
least ``start_timeout_s`` for its start-up: imports, a simulator's load). A process that
misses it is killed, one whose pipe breaks (a segfault, an ``os._exit``) is reaped; either
is restarted at once and its calls answer ``timeout`` or ``crash``; the caller decides
what the loss means for its episodes. An object that raises answers ``error`` and keeps
its process.

Processes start with ``forkserver``: the trainer may hold CUDA contexts and threads that
a ``fork`` would copy into the child in a broken state, and a restart from the fork server
costs a fork, not a fresh interpreter (``spawn``). Factories must therefore be picklable (a
class, a module-level function, a ``functools.partial`` of one).

Why not gymnasium's ``AsyncVectorEnv``: it has no per-environment deadline (a timeout in
``step_wait`` fails the whole batch and leaves the vector unusable), a dead worker breaks
every call, and it wants fixed ``gym.spaces`` and its own auto-reset, while an episode here
starts from a chosen seed.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

Factory = Optional[Callable[[], Any]]
# one call: (process index, object id, op, args); op "create" takes (builder, its args),
# "attrs" takes (attribute names,), "close" closes and drops the object, any other op is
# the object's method of that name
Call = Tuple[int, int, str, tuple]
FAILURES = ("timeout", "crash")


def _failure(exc: BaseException) -> Tuple[str, str]:
    """What the caller is told of an exception: its text, and the function it came from."""
    return (f"{type(exc).__name__}: {exc}",
            traceback.extract_tb(exc.__traceback__)[-1].name if exc.__traceback__ else "")


def _serve(conn: Any, factory: Factory) -> None:
    """A worker process: build its first object, then answer rounds of calls."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    objects: Dict[int, Any] = {}
    broken = None
    if factory is not None:
        try:
            objects[0] = factory()
        except Exception as exc:  # reported on the first call, where the parent can raise it
            broken = f"building the environment failed: {type(exc).__name__}: {exc}"
    while True:
        try:
            calls = conn.recv()
        except (EOFError, OSError):
            return
        if calls is None:  # shut down: close what is left, then leave
            for obj in objects.values():
                close = getattr(obj, "close", None)
                if callable(close):
                    close()
            return
        replies = []
        for object_id, op, args in calls:
            try:
                if broken is not None:
                    raise RuntimeError(broken)
                if op == "create":
                    builder, builder_args = args
                    objects[object_id] = builder(*builder_args)
                    value = None
                elif op == "close":
                    obj = objects.pop(object_id, None)
                    value = obj.close() if obj is not None else None
                elif op == "attrs":
                    value = tuple(getattr(objects[object_id], name) for name in args[0])
                else:
                    value = getattr(objects[object_id], op)(*args)
                replies.append(("ok", value))
            except Exception as exc:
                replies.append(("error", _failure(exc)))
        conn.send(replies)


class _Process:
    def __init__(self, context: Any, factory: Factory):
        self.conn, child = context.Pipe()
        self.proc = context.Process(target=_serve, args=(child, factory), daemon=True)
        self.proc.start()
        child.close()
        self.fresh = True  # its first answer waits for start-up

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


class EnvProcessPool:
    """``len(factories)`` worker processes (``factories[i]`` builds process i's object 0,
    or None for an empty table), called in rounds with per-process deadlines."""

    def __init__(self, factories: Sequence[Factory], step_timeout_s: float,
                 start_timeout_s: float = 120.0, start_method: str = "forkserver"):
        self.step_timeout_s = float(step_timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self._context = multiprocessing.get_context(start_method)
        self._factories = list(factories)
        self.processes: List[_Process] = []
        try:
            self.processes = [_Process(self._context, f) for f in self._factories]
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> List[int]:
        """The worker processes' ids, in order (they change on a restart)."""
        return [process.proc.pid for process in self.processes]

    def call_many(self, calls: Sequence[Call], timeout_s: Optional[float] = None
                  ) -> List[Tuple[str, Any]]:
        """Run ``calls``, every process at once; ``(status, value)`` per call: ``ok``
        (value), ``error`` (the object raised; value is ``(message, function)``),
        ``timeout`` or ``crash`` (its process was restarted; value None). ``timeout_s``
        replaces ``step_timeout_s`` for this round."""
        if calls and not self.processes:
            raise RuntimeError("this environment process pool is closed")
        results: List[Any] = [None] * len(calls)
        by_process: Dict[int, List[int]] = {}
        for index, call in enumerate(calls):
            by_process.setdefault(int(call[0]), []).append(index)
        start = time.monotonic()
        deadline: Dict[int, float] = {}
        for p, indices in by_process.items():
            process = self.processes[p]
            try:
                process.conn.send([(calls[i][1], calls[i][2], calls[i][3]) for i in indices])
            except (OSError, ValueError):  # its pipe is already gone
                self._lost(p, indices, "crash", results)
                continue
            limit = self.step_timeout_s if timeout_s is None else float(timeout_s)
            if process.fresh:
                limit = max(limit, self.start_timeout_s)
            deadline[p] = start + limit
        pending = {self.processes[p].conn: p for p in deadline}
        while pending:
            now = time.monotonic()
            for conn, p in list(pending.items()):
                if deadline[p] <= now:
                    del pending[conn]
                    self._lost(p, by_process[p], "timeout", results)
            if not pending:
                break
            soonest = min(deadline[p] for p in pending.values())
            for conn in wait(list(pending), timeout=max(0.0, soonest - now)):
                p = pending.pop(conn)
                try:
                    replies = conn.recv()
                    self.processes[p].fresh = False
                except (EOFError, OSError):
                    self._lost(p, by_process[p], "crash", results)
                    continue
                for i, reply in zip(by_process[p], replies, strict=True):
                    results[i] = reply
        return results

    def _lost(self, p: int, indices: List[int], kind: str, results: List[Any]) -> None:
        """Kill and restart process ``p``; its calls answer ``kind``."""
        for i in indices:
            results[i] = (kind, None)
        self.processes[p].kill()
        self.processes[p] = _Process(self._context, self._factories[p])

    def close(self) -> None:
        """Stop every process (politely, then by force) and reap it; safe to repeat."""
        processes, self.processes = self.processes, []
        for process in processes:
            try:
                process.conn.send(None)
            except (OSError, ValueError):
                pass
        stop_by = time.monotonic() + 2.0
        for process in processes:
            process.proc.join(timeout=max(0.0, stop_by - time.monotonic()))
            process.kill()
