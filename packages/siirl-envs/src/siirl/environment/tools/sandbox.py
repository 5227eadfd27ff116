"""Run the agent's Python in a sandbox that contains it, as root too, or refuses to run.

Each call starts ``sandbox_init.py``, which puts the code in new Linux user, mount, pid,
network, IPC and UTS namespaces (no new dependency: ``unshare(2)`` through ``ctypes``).
What the agent's code gets:

- files: a read-only view of what the interpreter needs (``/usr``, ``/bin``, ``/lib*``,
  the interpreter's prefixes ``sys.prefix``/``sys.base_prefix`` and its folder, the dynamic
  linker's cache and ``/etc/localtime``), ``/dev/null``, ``zero``, ``full``, ``random``,
  ``urandom``, a ``/proc`` of its own pid namespace, and private size-capped tmpfs folders:
  its working folder (``HOME``, ``TMPDIR``, a fresh path per call), ``/tmp`` and
  ``/dev/shm`` (``WRITABLE_MB`` each). Nothing else of the host's files exists for it, and
  nothing it writes reaches the host (all of it is gone when the call returns);
- no network: an empty network namespace (not even a loopback that is up), and Python's
  socket constructors raise in its own process for a clear error;
- processes: at most ``max_processes`` processes and threads (``RLIMIT_NPROC`` on a user
  id of its own: started by root, the agent runs as the host's ``nobody``, which the limit
  binds; started by an ordinary user, as that user with no capabilities). On kernels
  before 5.14 the limit counts all processes of that host user;
- nothing it starts outlives the call: its first process is pid 1 of the new pid
  namespace and exits when the agent's main process does (or at the wall-clock timeout),
  and the kernel then kills every process left in the namespace, double-forked ``setsid``
  daemons included;
- no signals to the host's processes: they are not in its pid namespace;
- no capabilities (bounding set emptied, ``no_new_privs``), no nested user namespaces;
- the limits of every call: CPU seconds (``RLIMIT_CPU``), address space (``RLIMIT_AS``: a
  memory bomb gets ``MemoryError``), size of any file it writes (``RLIMIT_FSIZE``, which
  also caps stdout/stderr: they go to files), no core dumps; the caller kills it at the
  wall-clock timeout and keeps at most ``max_output_chars`` of stdout and of stderr.

What it does **not** stop: reading what the read-only view shows (the interpreter's
installed packages, system libraries and programs); using CPU time and memory up to the
limits (no cgroup: memory is bounded per process by ``RLIMIT_AS``, so ``max_processes``
processes may together use that many times ``memory_mb``); kernel bugs (namespaces are not
a virtual machine). It has no GPU or other device beyond the five above.

Where the kernel or container refuses the namespaces (a seccomp profile,
``user.max_user_namespaces=0``), :func:`run_python` raises :class:`SandboxUnavailable`
naming ``sandbox_fusion`` (run the code on a remote service) and the opt-out
``allow_uncontained`` (trusted code only: then it runs with the resource limits alone,
in a fresh ``python -I`` process in its own session and temporary folder, sockets refused
in Python, the process group killed at the timeout).
"""

from __future__ import annotations

import marshal
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

from siirl.environment.tools.sandbox_init import AGENT_RUNNER
from siirl.errors import ConfigError

WRITABLE_MB = 64  # each private tmpfs: the working folder, /tmp, /dev/shm
# what the interpreter needs besides its own prefixes; each only where the host has it
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
                "/etc/localtime", "/etc/alternatives")
_INIT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_init.py")

# Limits of the uncontained run (``allow_uncontained`` where namespaces are refused).
_UNCONTAINED_LIMITS = r"""
import resource, sys
cpu, mem, fsize = (int(v) for v in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
del resource
"""


class SandboxUnavailable(ConfigError):
    """The local sandbox cannot contain code on this machine and no opt-out was given."""


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


_probe_lock = threading.Lock()
_probe_result: List[Optional[str]] = []


def isolation_problem() -> Optional[str]:
    """None when the local sandbox contains code on this machine, else why not. Probed
    once per process by running a one-line program in it."""
    with _probe_lock:
        if not _probe_result:
            result, error = _run("print('contained')", 10.0, 256, 256, "", 8, contained=True)
            if error is None and result.stdout.strip() != "contained":
                error = (f"a test program did not run (exit code {result.returncode}; "
                         f"{result.stderr.strip()[-300:] or 'no output'})")
            _probe_result.append(error)
        return _probe_result[0]


_REMOTE = ("Run the code on a SandboxFusion service instead: set "
           "reward_model.sandbox_fusion.url (or sandbox_fusion_url in the tool's config) to "
           "its run_code endpoint; or, only where the agent's code is trusted, set ")
_OPT_OUT = "allow_uncontained: true in the python tool's config"


def refusal_text(problem: str, where: str = "the python tool", opt_out: str = _OPT_OUT,
                 remote: bool = True) -> str:
    """The one-paragraph refusal for a machine whose kernel refuses the namespaces;
    ``remote``: whether the caller can send the code to ``sandbox_fusion`` instead."""
    return (f"{where}: the local sandbox cannot contain the agent's code on this machine "
            f"({problem}). It needs Linux user, mount, pid and network namespaces, which this "
            "kernel or container refuses (a container's seccomp profile, "
            "user.max_user_namespaces=0, kernel.unprivileged_userns_clone=0 or an AppArmor "
            "policy are the usual causes). "
            + (_REMOTE if remote else "This tool runs code only locally (the multi-turn "
               "python tool can use a sandbox_fusion service instead); only where the "
               "agent's code is trusted, set ")
            + f"{opt_out} to run it with the resource limits alone (it can then read and "
            "write the training user's files, start processes, reach the network through a "
            "spawned program and signal the user's processes).")


def require_isolation(where: str = "the python tool", opt_out: str = _OPT_OUT,
                      remote: bool = True) -> None:
    """Raise :class:`SandboxUnavailable` where the local sandbox cannot contain code."""
    problem = isolation_problem()
    if problem is not None:
        raise SandboxUnavailable(refusal_text(problem, where, opt_out, remote))


def run_python(code: str, timeout_s: float = 10.0, memory_mb: int = 1024,
               max_output_chars: int = 4096, stdin: str = "", max_processes: int = 32,
               allow_uncontained: bool = False) -> SandboxResult:
    """Run ``code`` contained; never raises for anything the code does. Raises
    :class:`SandboxUnavailable` where the machine refuses the namespaces, unless
    ``allow_uncontained`` (trusted code: resource limits only)."""
    problem = isolation_problem()
    if problem is not None and not allow_uncontained:
        raise SandboxUnavailable(refusal_text(problem))
    return _run(code, timeout_s, memory_mb, max_output_chars, stdin, max_processes,
                contained=problem is None)[0]


def read_only_paths() -> List[str]:
    """What the agent sees of the host, read-only: system folders and the interpreter's."""
    paths = list(SYSTEM_PATHS)
    executable = os.path.abspath(sys.executable)
    for path in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
                 os.path.dirname(executable),
                 os.path.dirname(os.path.dirname(os.path.realpath(executable)))):
        paths += [os.path.abspath(path), os.path.realpath(path)]
    kept: List[str] = []
    for path in sorted(set(paths), key=lambda p: (len(p), p)):
        if path != "/" and not any(path == k or path.startswith(k + "/") for k in kept):
            kept.append(path)
    return kept


def _run(code: str, timeout_s: float, memory_mb: int, max_output_chars: int, stdin: str,
         max_processes: int, contained: bool) -> Tuple[SandboxResult, Optional[str]]:
    """The result, and the sandbox's own error (it could not be built) if any."""
    base = tempfile.mkdtemp(prefix="siirl-sandbox-")
    work = os.path.join(base, "work")
    os.mkdir(work)
    status_r = -1
    try:
        code_path = os.path.join(work, "main.py")
        with open(code_path, "w") as handle:
            handle.write(code)
        out_path, err_path = os.path.join(base, "stdout"), os.path.join(base, "stderr")
        # a byte cap a little above the character limit (UTF-8 takes up to 4 per char)
        fsize = max(4 * int(max_output_chars) + 1024, 64 << 10)
        cpu, memory = max(1, int(timeout_s + 0.999)), int(memory_mb) << 20
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work,
               "TMPDIR": work, "PYTHONIOENCODING": "utf-8", "LANG": "C.UTF-8",
               # no thread pools: threads count as processes
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        pass_fds: Tuple[int, ...] = ()
        if contained:
            os.mkdir(os.path.join(base, "root"))
            status_r, status_w = os.pipe()
            pass_fds = (status_w,)
            env["PATH"] = f"{os.path.dirname(os.path.abspath(sys.executable))}:" \
                          "/usr/local/bin:/usr/bin:/bin"
            spec = {"status_fd": status_w, "base": base, "work": work, "code_path": code_path,
                    "python": os.path.abspath(sys.executable), "env": env,
                    "read_only": read_only_paths(), "writable_mb": WRITABLE_MB,
                    "host_root": os.geteuid() == 0,
                    "limits": {"cpu": cpu, "memory": memory, "fsize": fsize,
                               "processes": max(1, int(max_processes))}}
            spec_path = os.path.join(base, "spec")  # not on the command line the agent's
            with open(spec_path, "wb") as handle:  # /proc/1/cmdline shows
                marshal.dump(spec, handle)
            cmd = [sys.executable, "-I", _INIT_SCRIPT, spec_path]
        else:
            cmd = [sys.executable, "-I", "-c", _UNCONTAINED_LIMITS + AGENT_RUNNER, str(cpu),
                   str(memory), str(fsize)]
        try:
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.PIPE,
                                        stdout=out, stderr=err, start_new_session=True,
                                        pass_fds=pass_fds)
        finally:
            for fd in pass_fds:
                os.close(fd)
        timed_out = False
        try:
            proc.communicate(stdin.encode(), timeout=timeout_s + 1.0)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _stop(proc, contained)
        returncode, error = proc.returncode, None
        if contained:
            returncode, error = _status(status_r, proc.returncode, timed_out)
        if error is not None:
            return SandboxResult("", f"sandbox error: {error}", None), error
        stdout, cut_out = _read(out_path, max_output_chars)
        stderr, cut_err = _read(err_path, max_output_chars)
        if returncode in (-signal.SIGXCPU, -signal.SIGKILL) and not timed_out:
            timed_out = True  # the CPU limit stopped it
        return SandboxResult(stdout, _short_traceback(stderr), returncode, timed_out,
                             cut_out or cut_err), None
    finally:
        if status_r >= 0:
            os.close(status_r)
        shutil.rmtree(base, ignore_errors=True)


def _status(status_r: int, sandbox_code: Optional[int],
            timed_out: bool) -> Tuple[Optional[int], Optional[str]]:
    """The agent's return code and the sandbox's error, from its status lines."""
    os.set_blocking(status_r, False)
    data = b""
    while True:
        try:
            chunk = os.read(status_r, 4096)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    returncode, error = None, None
    for line in data.decode(errors="replace").splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "exit":
            returncode = os.waitstatus_to_exitcode(int(rest))
        elif kind == "error" and error is None:
            error = rest
    if returncode is None and error is None:
        if timed_out:
            returncode = -signal.SIGKILL
        else:
            error = f"the sandbox stopped before the code finished (exit code {sandbox_code})"
    return returncode, error


def _stop(proc: subprocess.Popen, contained: bool) -> None:
    """Stop the run. Contained: SIGTERM asks the sandbox to kill its pid namespace (and
    waits until it is empty); uncontained, or if that fails: SIGKILL to the process group."""
    if contained:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5.0)
                return
            except subprocess.TimeoutExpired:
                pass
        else:
            return
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
