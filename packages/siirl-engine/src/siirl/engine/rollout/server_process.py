"""An inference server owned by a rollout worker, whatever the engine (``vllm_server``,
``sglang_server`` fill in the command line and the endpoints).

:class:`ServerProcess` is the subprocess: bound to a free port on 127.0.0.1, in a process
group of its own (stopped with the rollout, at the worker's exit, and by a small watchdog
process when the worker dies without cleaning up), healthy within ``timeout_s`` or stopped
with the tail of its log, and JSON over HTTP.

:class:`ServerEngine` is what a rollout drives: a server, the weight files of the latest
sync in a private temporary directory, and one restart after a crash (the restarted server
gets the latest weights back before the failed call is retried; a second crash stops the
run).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from siirl.errors import SiirlError
from siirl.execution.scheduler.process_group_manager import free_port

LOG_TAIL_LINES = 8
REQUEST_TIMEOUT_S = 3600.0
FILE_BYTES = 256 << 20  # weights per safetensors file of a sync
# straight to 127.0.0.1, whatever proxy the environment names
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
CONNECTION_ERRORS = (urllib.error.URLError, ConnectionError, http.client.HTTPException,
                     TimeoutError, OSError)

# Runs beside the server, in its process group: when the worker that started them dies
# without stopping them (its parent pid changes), it stops the whole group.
_WATCHDOG = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
parent, group, me = int(sys.argv[1]), os.getpgid(0), os.getpid()

def others():  # live processes of the group besides this one (Linux /proc)
    if not os.path.isdir("/proc"):
        return True
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and int(pid) != me:
                with open(f"/proc/{pid}/stat") as stat:
                    state, _, pgrp = stat.read().rsplit(")", 1)[1].split()[:3]
                if int(pgrp) == group and state != "Z":
                    return True
        except (OSError, ValueError):
            continue
    return False

while os.getppid() == parent:
    time.sleep(1.0)
os.killpg(0, signal.SIGTERM)
deadline = time.monotonic() + 10.0
while others() and time.monotonic() < deadline:
    time.sleep(0.2)
os.killpg(0, signal.SIGKILL)
"""


class ServerError(SiirlError, RuntimeError):
    """The rollout's inference server did not start, failed a request, or crashed again
    after its restart."""

    exit_code = 1


def log_tail(path: Path, start: int = 0, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` non-blank lines written from byte ``start`` on, as one line."""
    try:
        with open(path, "rb") as log:
            log.seek(start)
            text = log.read().decode(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    tail = [line.strip() for line in text if line.strip()][-lines:]
    return " | ".join(tail) or "(empty log)"


def _stop_group(proc: Optional[subprocess.Popen], watchdog: Optional[subprocess.Popen],
                grace_s: float = 15.0) -> None:
    """SIGTERM the server's process group, SIGKILL whatever is left after ``grace_s``."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the engine's own processes, the watchdog
    except (ProcessLookupError, PermissionError):
        pass
    for child in (proc, watchdog):
        if child is not None:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


class ServerProcess:
    """One server subprocess: start (and wait for ``health_path``), stop, restart, JSON over
    HTTP. Subclasses give ``command()`` (using ``self.args`` and ``self.port``)."""

    label = "inference"  # "the {label} server of the rollout"
    error = ServerError  # raised for its failures
    marker_env = "SIIRL_ROLLOUT_SERVER"  # in its environment: finds its processes
    health_path = "/health"

    def __init__(self, args: List[str], timeout_s: float, log_path: Path):
        self.args = list(args)
        self.timeout_s = float(timeout_s)
        self.log_path = Path(log_path)
        self.proc: Optional[subprocess.Popen] = None
        self.watchdog: Optional[subprocess.Popen] = None
        self.port = 0
        self.log_start = 0  # where this start's part of the (appended) log begins
        self._finalizer: Optional[weakref.finalize] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> List[str]:
        raise NotImplementedError

    def environment(self) -> Dict[str, str]:
        return dict(os.environ, PYTHONUNBUFFERED="1")

    def start(self) -> None:
        self.stop()
        self.port = free_port()
        env = self.environment()
        env[self.marker_env] = str(self.log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.log_start = log.tell()
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} port {self.port}\n".encode())
            log.flush()
            # a process group of its own (in the worker's session, so that the watchdog
            # can join it; Python < 3.11 has no process_group: a new session, no watchdog)
            group = ({"process_group": 0} if sys.version_info >= (3, 11)
                     else {"start_new_session": True})
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, **group)
        self.watchdog = None
        if "process_group" in group:
            try:
                self.watchdog = subprocess.Popen(
                    [sys.executable, "-c", _WATCHDOG, str(os.getpid())],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, process_group=self.proc.pid)
            except OSError:  # the server already exited: wait_healthy says why
                pass
        self._finalizer = weakref.finalize(self, _stop_group, self.proc, self.watchdog)
        self.wait_healthy()

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                self.stop()
                raise self.error(
                    f"the {self.label} server of the rollout exited with code {code} while "
                    f"starting (log {self.log_path}): {self.log_tail()}")
            try:
                with _HTTP.open(self.url + self.health_path, timeout=5) as reply:
                    if reply.status == 200:
                        return
            except CONNECTION_ERRORS:  # not listening yet, or 503 while it starts
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise self.error(
                    f"the {self.label} server of the rollout did not answer "
                    f"{self.health_path} within actor_rollout_ref.rollout.server_timeout_s="
                    f"{self.timeout_s:g} s (log {self.log_path}): {self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self) -> str:
        return log_tail(self.log_path, self.log_start)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # once: stops the group
            self._finalizer = None
        self.proc = self.watchdog = None

    def _open(self, path: str, body: Any, timeout: float) -> Any:
        """The reply to a JSON POST; HTTP errors raise ``self.error`` with the server's
        answer, a lost connection ``OSError``."""
        data = json.dumps(body if body is not None else {}).encode()
        request = urllib.request.Request(self.url + path, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            return _HTTP.open(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:600]
            raise self.error(f"the rollout's {self.label} server answered {path} with HTTP "
                             f"{exc.code}: {' '.join(detail.split())}") from exc

    def post(self, path: str, body: Any = None, timeout: float = REQUEST_TIMEOUT_S) -> Any:
        """POST JSON; the decoded JSON reply (None when empty, the text when not JSON)."""
        with self._open(path, body, timeout) as reply:
            text = reply.read()
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except ValueError:  # e.g. a plain-text acknowledgement
            return text.decode(errors="replace")

    def stream(self, path: str, body: Dict[str, Any], timeout: float = REQUEST_TIMEOUT_S
               ) -> Iterator[Any]:
        """POST JSON with ``stream: true``; each server-sent event's decoded JSON, up to
        ``data: [DONE]``."""
        with self._open(path, dict(body, stream=True), timeout) as reply:
            for line in reply:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[len(b"data:"):].strip()
                if payload == b"[DONE]":
                    return
                yield json.loads(payload)


def write_safetensors(named: Iterable[Tuple[str, torch.Tensor]], target: Path,
                      file_bytes: int) -> None:
    """The named tensors as ``00000.safetensors``, ``00001...`` in ``target``, about
    ``file_bytes`` each."""
    from safetensors.torch import save_file

    tensors: Dict[str, torch.Tensor] = {}
    size = files = 0
    for name, tensor in named:
        # own storage per name: safetensors refuses tensors that share memory
        tensors[name] = tensor.detach().to("cpu", copy=True).contiguous()
        size += tensors[name].numel() * tensors[name].element_size()
        if size >= file_bytes:
            save_file(tensors, str(target / f"{files:05d}.safetensors"))
            tensors, size, files = {}, 0, files + 1
    if tensors:
        save_file(tensors, str(target / f"{files:05d}.safetensors"))


class ServerEngine:
    """The engine of a server-mode rollout (its ``llm``): a :class:`ServerProcess`, the
    weight files of the latest sync, one restart after a crash. Subclasses load a weights
    directory into the server (``_reload``) and sample (``sample``)."""

    def __init__(self, server: ServerProcess):
        self._weights_dir = Path(tempfile.mkdtemp(prefix="siirl-rollout-weights-"))
        weakref.finalize(self, shutil.rmtree, str(self._weights_dir), True)
        self._latest: Optional[Path] = None
        self._syncs = 0
        self._restarted = False
        self.server = server
        self.server.start()

    def close(self) -> None:
        """Stop the server and drop the weight files."""
        self.server.stop()
        shutil.rmtree(self._weights_dir, ignore_errors=True)

    # -- crash handling: one restart, with the latest weights -----------------------------
    def _call(self, action: Callable[[], Any]) -> Any:
        server = self.server
        try:
            return action()
        except (server.error, *CONNECTION_ERRORS) as exc:
            try:  # a dying server closes its socket a moment before it exits
                server.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if server.alive():
                if isinstance(exc, server.error):
                    raise
                raise server.error(f"lost the connection to the rollout's {server.label} "
                                   f"server (still running, log {server.log_path}): "
                                   f"{exc}") from exc
        code = server.proc.returncode
        if self._restarted:
            raise server.error(
                f"the rollout's {server.label} server crashed again (exit code {code}) after "
                f"its restart; the run stops (log {server.log_path}): {server.log_tail()}")
        self._restarted = True
        print(f"[siirl] the rollout's {server.label} server crashed (exit code {code}); "
              f"restarting it once (log {server.log_path})", file=sys.stderr, flush=True)
        server.start()
        self._restarted_fresh()
        if self._latest is not None:
            self._reload(self._latest)
        return self._call(action)

    def _restarted_fresh(self) -> None:
        """Hook: the server was just restarted (awake, with its start-up weights)."""

    # -- weight sync ----------------------------------------------------------------------
    def _file_bytes(self) -> int:
        return FILE_BYTES

    def _write(self, named: Iterable[Tuple[str, torch.Tensor]], target: Path) -> None:
        write_safetensors(named, target, self._file_bytes())

    def _reload(self, weights_dir: Path) -> None:
        raise NotImplementedError

    def reload_weights(self, named: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Write the named tensors as safetensors files and have the server load them in
        place (and drop its prefix cache); the latest files are kept for a restart."""
        self._syncs += 1
        target = self._weights_dir / f"sync{self._syncs}"
        target.mkdir()
        self._write(named, target)
        self._call(lambda: self._reload(target))
        if self._latest is not None:
            shutil.rmtree(self._latest, ignore_errors=True)
        self._latest = target
