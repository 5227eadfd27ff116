"""The python tool's sandbox (``siirl.environment.tools.sandbox``) against one escape per
class: host files read or written, network, unbounded processes, a survivor after the
call, a signal to a host process. Each test holds as whoever runs the tests (root in CI);
run as root, the last test runs them all again as the unprivileged user ``nobody``. Where
the kernel refuses namespaces the contract is the refusal, which is tested too."""

import os
import shutil
import socket
import stat
import subprocess
import sys
import uuid

import pytest
import yaml

from siirl.environment.adapters.gem import GemEnv
from siirl.environment.tools import load_tools, sandbox
from siirl.environment.tools.parsing import ToolCall
from siirl.environment.tools.sandbox import SandboxUnavailable, run_python
from siirl.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def contained(code: str, **kwargs):
    """``run_python``'s result where the sandbox contains code; else the refusal is the
    contract, checked here, and the test skips its escape attempt."""
    if sandbox.isolation_problem() is not None:
        with pytest.raises(SandboxUnavailable, match="sandbox_fusion"):
            run_python(code, **kwargs)
        pytest.skip(f"the sandbox refuses here: {sandbox.isolation_problem()}")
    return run_python(code, **kwargs)


def readable_by_anyone(path) -> None:
    os.chmod(path, os.stat(path).st_mode | stat.S_IROTH | stat.S_IXOTH)


def test_the_sandbox_contains_wherever_the_kernel_gives_namespaces():
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-Urmpn", "--fork", "true"],
                                         capture_output=True).returncode != 0:
        pytest.skip("util-linux unshare is missing or refused here")
    assert sandbox.isolation_problem() is None


def test_no_host_file_is_read(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    readable_by_anyone(tmp_path)
    readable_by_anyone(secret)  # the host would let any user read it
    paths = [str(secret), "/etc/shadow", "/etc/hostname", os.path.abspath(__file__)]
    code = (f"import os\nfor path in {paths!r}:\n"
            "    try:\n        print('READ', path, open(path).read()[:20])\n"
            "    except OSError as exc:\n        print('refused', path, type(exc).__name__)\n"
            "for folder in ('/etc', '/root', '/tmp'):\n"
            "    print(folder, sorted(os.listdir(folder)) if os.path.isdir(folder) else [])\n")
    result = contained(code, timeout_s=10)
    assert result.returncode == 0, result.text()
    assert "READ" not in result.stdout and result.stdout.count("refused") == len(paths)
    seen = dict(line.split(" ", 1) for line in result.stdout.splitlines()
                if line.startswith("/"))
    assert set(eval(seen["/etc"])) <= {"passwd", "group", "ld.so.cache", "ld.so.conf",
                                       "ld.so.conf.d", "localtime", "alternatives"}
    # of /root and /tmp only the way to a bound interpreter prefix, if one lies there (a
    # checkout under /tmp has its venv there), and under /tmp the sandbox's own folder
    assert set(eval(seen["/root"])) <= way_to_bound_paths("/root")
    assert all(name.startswith("siirl-sandbox-") or name in way_to_bound_paths("/tmp")
               for name in eval(seen["/tmp"]))


def way_to_bound_paths(folder: str) -> set:
    """The entries of ``folder`` the sandbox needs to reach a read-only path below it."""
    return {p.split("/")[2] for p in sandbox.read_only_paths() if p.startswith(folder + "/")}


def test_no_host_file_is_written(tmp_path):
    drop = tmp_path / "drop"
    drop.mkdir()
    os.chmod(drop, 0o777)
    readable_by_anyone(tmp_path)
    kept = tmp_path / "kept.txt"
    kept.write_text("original")
    os.chmod(kept, 0o666)  # the host would let any user write both
    leak = f"/tmp/siirl-leak-{uuid.uuid4().hex}"
    targets = [str(drop / "new.txt"), str(kept), os.path.join(sys.prefix, "new.txt"),
               "/usr/new.txt", leak]
    code = (f"for path in {targets!r}:\n"
            "    try:\n        open(path, 'a').write('agent')\n        print('wrote', path)\n"
            "    except OSError as exc:\n        print('refused', path, type(exc).__name__)\n")
    fresh = [path for path in targets if not os.path.exists(path)]
    try:
        result = contained(code, timeout_s=10)
    finally:  # an escape must not leave files behind on the host
        escaped = [path for path in fresh if os.path.exists(path)]
        for path in escaped:
            os.remove(path)
    assert result.returncode == 0, result.text()
    assert f"wrote {leak}" in result.stdout  # its private /tmp takes writes ...
    assert not escaped, escaped               # ... none of which reaches the host
    assert kept.read_text() == "original"


def test_no_network_even_for_a_spawned_program():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    probe = (f"import socket; print(socket.if_nameindex()); "
             f"socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')")
    code = ("import subprocess, sys\n"  # a fresh interpreter: no Python-level socket guard
            f"done = subprocess.run([sys.executable, '-c', {probe!r}], capture_output=True, "
            "text=True)\nprint(done.stdout, done.stderr.strip().splitlines()[-1:])\n")
    try:
        result = contained(code, timeout_s=10)
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
    assert result.returncode == 0, result.text()
    assert "CONNECTED" not in result.stdout and "[(1, 'lo')]" in result.stdout, result.stdout


def test_processes_are_bounded_and_a_fork_bomb_returns():
    code = ("import os, time\ncount = 0\ntry:\n    while count < 200:\n"
            "        if os.fork() == 0:\n            time.sleep(20)\n            os._exit(0)\n"
            "        count += 1\nexcept OSError as exc:\n    print('refused', exc.errno)\n"
            "print('started', count)\n")
    result = contained(code, timeout_s=10, max_processes=8)
    assert result.returncode == 0, result.text()
    started = int(result.stdout.split("started ")[1])
    assert 0 < started < 8 and "refused" in result.stdout, result.stdout
    name = f"bomb{uuid.uuid4().hex[:10]}"  # its processes' name, to look for them after
    bomb = (f"open('/proc/self/comm', 'w').write({name!r})\nimport os\nwhile True:\n"
            "    try:\n        os.fork()\n    except OSError:\n        pass\n")
    result = contained(bomb, timeout_s=1)
    assert result.timed_out
    assert not _host_processes(lambda pid: _read(f"/proc/{pid}/comm").strip() == name)


def test_nothing_outlives_the_call():
    marker = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"  # sleep's argument, as a marker
    code = ("import os, subprocess, time\n"
            "subprocess.Popen(['sleep', " + repr(marker) + "], start_new_session=True)\n"
            "child = os.fork()\nif child == 0:\n    os.setsid()\n"
            "    if os.fork() == 0:\n        os.execv('/bin/sleep', ['sleep', "
            + repr(marker) + "])\n    os._exit(0)\nos.waitpid(child, 0)\ntime.sleep(0.3)\n"
            "running = [p for p in os.listdir('/proc') if p.isdigit() and "
            + repr(marker) + " in open(f'/proc/{p}/cmdline').read()]\n"
            "print('running', len(running))\n")
    result = contained(code, timeout_s=10)
    assert result.stdout.strip() == "running 2", result.text()  # both daemons were up
    assert not _host_processes(lambda pid: marker in _read(f"/proc/{pid}/cmdline"))


def test_no_signal_reaches_a_host_process():
    host = subprocess.Popen(["sleep", "30"])  # the same user's: the host would allow it
    try:
        code = ("import os, signal\n"
                f"for sig in (signal.SIGKILL, signal.SIGTERM):\n    try:\n"
                f"        os.kill({host.pid}, sig)\n        print('sent')\n"
                "    except OSError as exc:\n        print('refused', type(exc).__name__)\n")
        result = contained(code, timeout_s=10)
        assert result.returncode == 0, result.text()
        assert host.poll() is None and "sent" not in result.stdout, result.stdout
    finally:
        host.kill()
        host.wait()


def test_the_refusal_names_the_remote_sandbox_and_the_opt_out(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "isolation_problem", lambda: "unshare(...): not permitted")
    with pytest.raises(SandboxUnavailable) as refusal:
        run_python("print(1)")
    text = str(refusal.value)
    assert "sandbox_fusion" in text and "allow_uncontained" in text and "\n" not in text
    assert "unshare(...): not permitted" in text
    config = tmp_path / "tools.yaml"
    entry = {"class_name": "python", "config": {"timeout_s": 5}}
    config.write_text(yaml.safe_dump({"tools": [entry]}))
    with pytest.raises(ConfigError, match=r"tools\.yaml: tools\[0\].*sandbox_fusion"):
        load_tools(str(config))  # refused when the run starts, not at the first call
    entry["config"]["allow_uncontained"] = "yes"
    config.write_text(yaml.safe_dump({"tools": [entry]}))
    with pytest.raises(ConfigError, match="allow_uncontained must be true or false"):
        load_tools(str(config))
    entry["config"]["allow_uncontained"] = True  # trusted code: resource limits only
    config.write_text(yaml.safe_dump({"tools": [entry]}))
    tools = load_tools(str(config))
    assert tools.call(ToolCall("python", {"code": "print(6 * 7)"})) == "42\n"
    entry["config"] = {"sandbox_fusion_url": "http://127.0.0.1:9/run_code"}
    config.write_text(yaml.safe_dump({"tools": [entry]}))
    assert "python" in load_tools(str(config)).tools  # remote code needs no local sandbox
    with pytest.raises(SandboxUnavailable, match="tool_allow_uncontained") as refusal:
        GemEnv(env_id="game:GuessTheNumber-v0-easy", tool="python")  # GEM's python tool
    assert "runs code only locally" in str(refusal.value)
    assert GemEnv(env_id="game:GuessTheNumber-v0-easy", tool="python",
                  tool_allow_uncontained=True).tool == "python"


def test_the_probe_reports_a_kernel_that_refuses_namespaces():
    """A real refusal: inside a user namespace whose user.max_user_namespaces is 0."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("util-linux unshare is not installed")
    script = ("from siirl.environment.tools import sandbox\n"
              "try:\n    sandbox.require_isolation()\n    print('CONTAINED')\n"
              "except sandbox.SandboxUnavailable as exc:\n    print(exc)\n")
    done = subprocess.run(
        [unshare, "-Ur", "sh", "-c", 'echo 0 > /proc/sys/user/max_user_namespaces && '
         'exec "$0" -c "$1"', sys.executable, script], capture_output=True, text=True,
        timeout=60)
    if done.returncode != 0 or not done.stdout:
        pytest.skip(f"cannot build a namespace without user namespaces here: {done.stderr}")
    assert "CONTAINED" not in done.stdout
    assert "unshare" in done.stdout and "sandbox_fusion" in done.stdout, done.stdout


def test_the_escape_tests_hold_for_an_unprivileged_user():
    if os.geteuid() != 0:
        pytest.skip("the tests above already ran as an unprivileged user")
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if unshare is None or setpriv is None:
        pytest.skip("needs util-linux unshare and setpriv to run the tests as nobody")
    done = subprocess.run(
        [unshare, "-m", "sh", "-c", _as_nobody_script(setpriv)],
        capture_output=True, text=True, cwd=REPO, timeout=300,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
             "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"})
    summary = done.stdout.strip().splitlines()[-1:] or [done.stderr[-2000:]]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in summary[0] and "skipped" not in summary[0], summary[0]


def _as_nobody_script(setpriv: str) -> str:
    """Shell run in a private mount namespace: make the interpreter reachable for nobody
    (folders like a 0700 /root on the way get a tmpfs with the needed paths bound back),
    then run this file's other tests as uid/gid 65534."""
    needed = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, REPO)})
    blocked = set()
    for path in needed:
        parts = path.split("/")
        for depth in range(2, len(parts)):
            folder = "/".join(parts[:depth])
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                blocked.add(folder)
                break
    lines = ["set -e", "mount --make-rprivate /", "stash=$(mktemp -d)"]
    rebind = [p for p in needed if any(p.startswith(b + "/") for b in blocked)]
    for k, path in enumerate(rebind):
        lines += [f'mkdir "$stash/{k}"', f"mount --bind '{path}' \"$stash/{k}\""]
    lines += [f"mount -t tmpfs -o mode=755 tmpfs '{folder}'" for folder in sorted(blocked)]
    for k, path in enumerate(rebind):
        lines += [f"mkdir -p '{path}'", f"mount --bind \"$stash/{k}\" '{path}'"]
    lines.append(f"exec {setpriv} --reuid=65534 --regid=65534 --clear-groups -- "
                 f"'{sys.executable}' -m pytest -q -p no:cacheprovider "
                 f"'{os.path.abspath(__file__)}' -k 'not unprivileged'")
    return "\n".join(lines)


def _read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _host_processes(match) -> list:
    return [pid for pid in os.listdir("/proc") if pid.isdigit() and match(pid)]
