"""The python tool on a remote SandboxFusion service (bytedance/SandboxFusion's
``POST /run_code``), for users who run one: the code never executes on the trainer.

Request (as verl's ``call_sandbox_api`` sends it)::

    {"code": ..., "language": "python", "stdin": "", "compile_timeout": T, "run_timeout": T,
     "memory_limit_MB": M, "files": {}, "fetch_files": []}

Response: ``{"status": "Success" | "Failed" | "SandboxError", "message": ...,
"run_result": {"status": "Finished" | "TimeLimitExceeded" | "Error", "stdout", "stderr",
"return_code", "execution_time"}, "compile_result": {...}}``. A 504 is retried; anything
that goes wrong comes back as error text for the agent.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict

from siirl.environment.tools.sandbox import SandboxResult

RETRIES = 3
_LIMITS: Dict[tuple, threading.Semaphore] = {}  # (url, max_concurrent) -> in-flight limit
_LOCK = threading.Lock()


def _semaphore(url: str, max_concurrent: int) -> threading.Semaphore:
    with _LOCK:
        key = (url, int(max_concurrent))
        if key not in _LIMITS:
            _LIMITS[key] = threading.Semaphore(max(1, int(max_concurrent)))
        return _LIMITS[key]


def _post(url: str, payload: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Accept": "application/json"})
    for attempt in range(RETRIES):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read().decode("utf-8", errors="replace"))
        except urllib.error.HTTPError as exc:
            if exc.code != 504 or attempt == RETRIES - 1:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise RuntimeError("unreachable")


def run_remote(url: str, code: str, timeout_s: float = 10.0, memory_mb: int = 1024,
               max_output_chars: int = 4096, max_concurrent: int = 64,
               language: str = "python") -> SandboxResult:
    """Run ``code`` on the service at ``url``; never raises."""
    payload = {"code": code, "language": language, "stdin": "",
               "compile_timeout": timeout_s, "run_timeout": timeout_s,
               "memory_limit_MB": int(memory_mb), "files": {}, "fetch_files": []}
    try:
        with _semaphore(url, max_concurrent):
            answer = _post(url, payload, timeout=2 * timeout_s + 10)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return SandboxResult("", f"sandbox service error: {exc}", None)
    if not isinstance(answer, dict):
        return SandboxResult("", f"sandbox service error: unexpected answer {answer!r:.200}",
                             None)
    run = answer.get("run_result") or {}
    compiled = answer.get("compile_result") or {}
    status = answer.get("status")
    stdout = str(run.get("stdout") or "")
    stderr = str(run.get("stderr") or compiled.get("stderr") or "")
    if status == "SandboxError":
        stderr = stderr or f"sandbox service error: {answer.get('message', '')}"
    timed_out = "TimeLimitExceeded" in (run.get("status"), compiled.get("status"))
    code_ = run.get("return_code")
    cut = len(stdout) > max_output_chars or len(stderr) > max_output_chars
    return SandboxResult(stdout[:max_output_chars], stderr[:max_output_chars],
                         int(code_) if isinstance(code_, int) else None, timed_out, cut)
