"""The reward worker process: ``python -m siirl.engine.reward_manager.worker_main R W``.

It loads the reward function once, then scores what the trainer sends over fd ``R`` and
answers over fd ``W``: in ``rows`` mode one message per sample, in order, as each is
done (so when the process dies or hangs, the trainer knows which sample did it); in
``batch`` mode one message for the whole call. Results are checked here (``outcome``),
so only plain numbers and the dict's extra keys travel back.

SIGINT is ignored (and arrives blocked, see ``_process``): Ctrl-C is the trainer's to
handle, and it stops this process. It also dies with the trainer (``PR_SET_PDEATHSIG``,
or a watch thread where that is unavailable), so it never outlives a killed run.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Callable, Dict, Tuple

from siirl.engine.reward_manager.outcome import Failure, call_batch, call_row
from siirl.errors import ConfigError

_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):  # not Linux: poll for the parent instead
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, daemon=True, name="parent-watch").start()
    if os.getppid() != parent:  # it died before the death signal was armed
        os._exit(1)


def _resolve(target: Tuple[Any, ...]) -> Tuple[Callable[..., Any], Dict[str, Any]]:
    if target[0] == "default":
        from siirl.engine.reward_score import default_compute_score

        return default_compute_score, {}
    if target[0] == "path":
        from siirl.engine.reward_manager.loader import load_custom_function

        return load_custom_function(target[1], target[2]), dict(target[3])
    return target[1], dict(target[2])


def _send(results: Connection, message: Any) -> None:
    try:
        results.send(message)  # pickles first: a failure leaves the pipe clean
    except Exception as exc:
        results.send(Failure("non_numeric", "the result cannot be sent back to the trainer "
                                            f"({type(exc).__name__}: {exc})"))


def _guarded(call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except ConfigError as exc:  # a setup problem: the trainer raises it
        return ("config_error", str(exc))
    except BaseException as exc:  # KeyboardInterrupt raised by the function itself, ...
        return Failure("exception", f"{type(exc).__name__}: {exc}")


def main(argv: list) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tasks = Connection(int(argv[1]), writable=False)
    results = Connection(int(argv[2]), readable=False)
    sys_path, target, parent = tasks.recv()
    sys.path[:0] = [p for p in sys_path if p not in sys.path]  # the trainer's imports
    _die_with(parent)
    try:
        fn, kwargs = _resolve(target)
    except BaseException as exc:
        # load_custom_function's ConfigError already names the file and the cause
        message = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        results.send(("load_error", message))
        return
    results.send(("ready", None))
    while True:
        try:
            message = tasks.recv()
        except EOFError:  # the trainer closed the pipe
            return
        if message is None:
            return
        mode, rows = message
        if mode == "rows":
            for row in rows:
                _send(results, _guarded(call_row, fn, row, kwargs))
        else:
            _send(results, _guarded(call_batch, fn, rows, kwargs))


if __name__ == "__main__":
    main(sys.argv)
