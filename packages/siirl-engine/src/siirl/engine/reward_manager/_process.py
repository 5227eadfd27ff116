"""One reward worker process (``worker_main``), from the trainer's side.

Started with ``subprocess`` (not ``multiprocessing``), so it imports only ``worker_main``,
never the trainer's ``__main__``. SIGINT is blocked while it starts and stays blocked in
it: Ctrl-C reaches the trainer alone, which then kills it. Every live worker is killed at
exit (``atexit``); one whose trainer is killed dies with it (``worker_main``).

This module imports no torch.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
import weakref
from multiprocessing.connection import Connection, wait
from typing import Any, Iterator, Optional, Tuple

from siirl.engine.reward_manager.outcome import Failure
from siirl.errors import ConfigError

_CHILD = "siirl.engine.reward_manager.worker_main"
# Importing the user's module in a fresh interpreter can be slow (it may import torch);
# this bounds it without counting it against any sample's timeout.
START_TIMEOUT_S = 120.0
_LIVE: weakref.WeakSet[ScoringProcess] = weakref.WeakSet()

# What a worker runs: ("default",) for the built-in rules, ("path", file, name, kwargs)
# for a custom function (loaded in the worker, so it needs no pickling), or
# ("callable", fn, kwargs) for an importable module-level function.
Target = Tuple[Any, ...]


@atexit.register
def _kill_all() -> None:
    for process in list(_LIVE):
        process.kill()


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """A child started in here inherits SIGINT blocked; one that arrives meanwhile is
    delivered to the trainer afterwards, not lost."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _death_kind(code: Optional[int]) -> Failure:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (a segmentation fault)" if name == "SIGSEGV" else ""
        return Failure("crash", f"the reward worker process was killed by {name}{hint}")
    return Failure("exit", f"the reward worker process exited with exit code {code} (the "
                           "function, or a library it calls, ended the process: os._exit?)")


class ScoringProcess:
    """One ``worker_main`` process and its two pipes."""

    def __init__(self, target: Target):
        task_r, task_w = os.pipe()
        result_r, result_w = os.pipe()
        try:
            with _sigint_blocked():
                self.popen = subprocess.Popen(
                    [sys.executable, "-m", _CHILD, str(task_r), str(result_w)],
                    pass_fds=(task_r, result_w))
        except BaseException:
            os.close(task_w)
            os.close(result_r)
            raise
        finally:
            os.close(task_r)  # the child's ends: EOF/EPIPE then say the child is gone
            os.close(result_w)
        self.tasks = Connection(task_w, readable=False)
        self.results = Connection(result_r, writable=False)
        self.started = time.monotonic()
        self.ready = False
        _LIVE.add(self)
        try:
            self.tasks.send((list(sys.path), target, os.getpid()))
        except (OSError, EOFError):
            pass  # it died at once: its exit is read as a start failure
        except Exception as exc:
            self.kill()
            raise ConfigError("the reward function cannot be sent to a reward worker process "
                              f"({type(exc).__name__}: {exc}); pass a module-level function "
                              "or set custom_reward_function.path") from exc

    def alive(self) -> bool:
        return self.popen.poll() is None

    def receive(self) -> Any:
        """The next message; EOFError when the process is gone."""
        try:
            return self.results.recv()
        except (EOFError, OSError):
            raise EOFError from None
        except Exception as exc:  # a result the trainer cannot unpickle; the pipe is in step
            return Failure("non_numeric", "the result cannot be read by the trainer "
                                          f"({type(exc).__name__}: {exc})")

    def await_ready(self) -> None:
        """Block until the function is loaded (bounded by ``START_TIMEOUT_S``)."""
        while not self.ready:
            left = self.started + START_TIMEOUT_S - time.monotonic()
            if left <= 0 or not wait([self.results], left):
                self.kill()
                raise ConfigError(f"the reward worker process did not load the reward "
                                  f"function within {START_TIMEOUT_S:g} s: does importing "
                                  "its file (custom_reward_function.path) hang?")
            self.on_start_message()

    def on_start_message(self) -> None:
        try:
            kind, value = self.receive()
        except EOFError:
            code = self.reap()
            raise ConfigError("the reward worker process ended while importing the reward "
                              f"function's file: {_death_kind(code).reason}") from None
        if kind == "load_error":
            self.kill()
            raise ConfigError(value)
        self.ready = True

    def reap(self) -> Optional[int]:
        try:
            self.popen.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        return self.popen.returncode

    def death(self) -> Failure:
        """Why the process is gone (after EOF on its pipe)."""
        return _death_kind(self.reap())

    def kill(self) -> None:
        _LIVE.discard(self)
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        for conn in (self.tasks, self.results):
            conn.close()

    def close(self) -> None:
        try:
            self.tasks.send(None)
            self.popen.wait(timeout=1)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()
