"""Run untrusted Python from the agent in a separate, limited process.

Each call is a fresh ``python -I`` process (no user site, no PYTHON* variables) in its own
new session, working in a new temporary folder that is removed afterwards (also its
``HOME`` and ``TMPDIR``). Before the agent's code runs, the child process:

- limits itself with ``setrlimit``: CPU seconds (``RLIMIT_CPU``; SIGXCPU/SIGKILL past
  it), address space (``RLIMIT_AS``: a memory bomb gets ``MemoryError``), size of any file
  it writes (``RLIMIT_FSIZE``, which also caps stdout/stderr: they go to files), core
  dumps off, and (not root) ``RLIMIT_NPROC`` 0, so it cannot start processes;
- moves into new, empty user and network namespaces (``unshare``) when the kernel allows
  it, so it has no network interface at all; and in any case replaces Python's socket
  constructors with ones that raise, so ``socket``/``urllib``/``http`` calls fail.

The parent kills the whole process group at the wall-clock timeout, and keeps at most
``max_output_chars`` of stdout and of stderr.

What this does **not** stop (it is not a container): reading and writing files outside
the temporary folder with the training user's permissions (absolute paths); without
namespaces, network access through ``ctypes`` or a spawned program (and as root
``RLIMIT_NPROC`` does not apply, so spawning is possible); using the GPU; signals to
other processes of the same user. For untrusted code at scale point the tool at a real
sandbox service (``sandbox_fusion``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

# Runs in the child: limits, isolation, then the agent's code from main.py.
_RUNNER = r"""
import ctypes, os, resource, sys
cpu, mem, fsize = (int(v) for v in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
root = os.getuid() == 0
try:
    libc = ctypes.CDLL(None, use_errno=True)
    isolated = libc.unshare(0x10000000 | 0x40000000) == 0  # CLONE_NEWUSER | CLONE_NEWNET
except Exception:
    isolated = False
import socket, _socket
def _blocked(*args, **kwargs):
    raise PermissionError("network access is disabled in the sandbox")
for _mod, _names in ((socket, ("socket", "SocketType", "create_connection",
                               "socketpair", "fromfd", "create_server",
                               "getaddrinfo")),
                     (_socket, ("socket", "socketpair", "getaddrinfo"))):
    for _name in _names:
        if hasattr(_mod, _name):
            setattr(_mod, _name, _blocked)
if not root:
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
del ctypes, resource, _mod, _names, _name
sys.argv = ["main.py"]
with open("main.py") as _f:
    _code = compile(_f.read(), "main.py", "exec")
del _f
exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
"""


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool = False
    truncated: bool = False

    def text(self) -> str:
        """What the agent sees: the output, and why the run stopped when it failed."""
        parts = [self.stdout] if self.stdout else []
        if self.stderr:
            parts.append(("stderr:\n" if self.stdout else "") + self.stderr)
        if self.timed_out:
            parts.append("error: the code ran past its time limit and was stopped")
        elif self.returncode not in (0, None) and not self.stderr:
            how = f"signal {-self.returncode}" if self.returncode < 0 else \
                f"exit code {self.returncode}"
            parts.append(f"error: the code stopped with {how}")
        if self.truncated:
            parts.append("(output truncated)")
        return "\n".join(parts) if parts else "(no output)"


def _read(path: str, limit: int) -> tuple[str, bool]:
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    return data[:limit].decode("utf-8", errors="replace"), len(data) > limit


def run_python(code: str, timeout_s: float = 10.0, memory_mb: int = 1024,
               max_output_chars: int = 4096, stdin: str = "") -> SandboxResult:
    """Run ``code``; never raises for anything the code does."""
    base = tempfile.mkdtemp(prefix="siirl-sandbox-")
    work = os.path.join(base, "work")
    os.mkdir(work)
    try:
        with open(os.path.join(work, "main.py"), "w") as handle:
            handle.write(code)
        out_path, err_path = os.path.join(base, "stdout"), os.path.join(base, "stderr")
        # a byte cap a little above the character limit (UTF-8 takes up to 4 per char)
        fsize = max(4 * int(max_output_chars) + 1024, 64 << 10)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work,
               "TMPDIR": work, "PYTHONIOENCODING": "utf-8", "LANG": "C.UTF-8",
               # no thread pools: threads count as processes under RLIMIT_NPROC
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        cmd = [sys.executable, "-I", "-c", _RUNNER, str(max(1, int(timeout_s + 0.999))),
               str(int(memory_mb) << 20), str(fsize)]
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.PIPE,
                                    stdout=out, stderr=err, start_new_session=True)
            timed_out = False
            try:
                proc.communicate(stdin.encode(), timeout=timeout_s + 1.0)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)
        stdout, cut_out = _read(out_path, max_output_chars)
        stderr, cut_err = _read(err_path, max_output_chars)
        if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and not timed_out:
            timed_out = True  # the CPU limit stopped it
        return SandboxResult(stdout, _short_traceback(stderr), proc.returncode, timed_out,
                             cut_out or cut_err)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop the child and anything it started in its session."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + 5.0
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)


def _short_traceback(stderr: str) -> str:
    """Drop the runner's own frame from tracebacks (the agent's code is main.py)."""
    return "\n".join(line for line in stderr.splitlines()
                     if 'File "<string>"' not in line and "exec(_code" not in line)
