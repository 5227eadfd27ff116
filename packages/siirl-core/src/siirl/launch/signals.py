"""SIGTERM as Ctrl-C: raised in the main thread as :class:`Terminated` (a
``KeyboardInterrupt``), so the same cleanup runs (workers and a local Ray cluster stopped, an
unfinished checkpoint left as ``.partial`` and never committed) and the command prints one
line instead of dying mid-write."""

from __future__ import annotations

import signal
import threading
from typing import Any

_installed = False
_received = False  # Ray may re-raise our exception as a plain KeyboardInterrupt


class Terminated(KeyboardInterrupt):
    """The process got SIGTERM."""


def _raise_terminated(signum: int, frame: Any) -> None:
    global _received
    _received = True
    raise Terminated()


def terminated(exc: BaseException) -> bool:
    """Whether ``exc`` (a ``KeyboardInterrupt``) came from SIGTERM."""
    return isinstance(exc, Terminated) or _received


def handle_sigterm() -> None:
    """Turn SIGTERM into :class:`Terminated` unless someone else handles it already."""
    global _installed
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_terminated)
        _installed = True


def ignore_further() -> None:
    """Once the command is stopping: further SIGINT/SIGTERM are ignored so the interpreter's
    own clean-up (Ray's exit hooks) finishes and the exit status stays 130/143."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def reinstall() -> None:
    """After ``ray.init``, whose C++ failure handler takes SIGTERM over (it logs and exits
    1): ours again, where the command had installed it."""
    if _installed and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)
