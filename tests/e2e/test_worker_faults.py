"""Faults of a 2-worker CPU job: a stopped worker is named by its heartbeats; SIGTERM and
Ctrl-C stop the driver and every worker within seconds with one line and no traceback,
keeping the committed checkpoint."""

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from test_multi_worker import TWO, _cmd, _env

LONG = [*TWO, "trainer.total_training_steps=500", "trainer.test_freq=-1"]


def foreground() -> None:
    """In the child before exec: Ctrl-C as a terminal's foreground job gets it. A test run
    started in the background of a non-interactive shell ignores SIGINT, and an ignored
    signal stays ignored across exec: the job would never see the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def start(run_dir, *overrides):
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    # a session of its own, as a terminal's foreground job: Ctrl-C goes to the group
    return subprocess.Popen(_cmd(run_dir, ray_dir, [*LONG, *overrides]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=_env(), start_new_session=True, preexec_fn=foreground)


def wait_for_steps(proc, run_dir: Path, count: int) -> list:
    """The workers (workers.json) once ``count`` steps are logged."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.is_file() and metrics.read_text().count("\n") >= count):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.3)
    return json.loads((run_dir / "workers.json").read_text())


def finish(proc, within_s: float) -> str:
    try:
        _, err = proc.communicate(timeout=within_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the job was still running {within_s:.0f} s after the fault")
    return err


def gone(pid: int, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie of an exited worker counts as gone
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (OSError, IndexError):
            return True
        time.sleep(0.2)
    return False


def test_a_stopped_worker_is_named_by_its_heartbeat(tmp_path):
    proc = start(tmp_path, "trainer.save_freq=-1", "trainer.heartbeat_timeout_s=6")
    victim = wait_for_steps(proc, tmp_path, 2)[1]
    os.kill(victim["pid"], signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        err = finish(proc, 60)
    finally:
        try:
            os.kill(victim["pid"], signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert time.monotonic() - stopped_at < 60
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert f"worker rank 1 (pid {victim['pid']} on" in last, err[-3000:]
    assert "stopped responding" in last and "heartbeat_timeout_s=6" in last
    assert "Traceback" not in err


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "terminated"),
                                             (signal.SIGINT, 130, "interrupted")])
def test_a_signal_stops_driver_and_workers_within_seconds(tmp_path, sig, code, word):
    proc = start(tmp_path, "trainer.save_freq=2")
    workers = wait_for_steps(proc, tmp_path, 3)
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # Ctrl-C: the terminal signals the whole group
    else:
        os.kill(proc.pid, sig)  # SIGTERM: e.g. a scheduler stopping the job
    signalled_at = time.monotonic()
    err = finish(proc, 30)
    assert time.monotonic() - signalled_at < 30
    assert proc.returncode == code, err[-3000:]
    assert err.strip().splitlines()[-1].startswith(f"siirl-train: {word}"), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert all(gone(w["pid"]) for w in workers)
    committed = [p for p in tmp_path.glob("global_step_*") if (p / "COMMITTED").exists()]
    assert committed, "the checkpoint of step 2 was lost"
