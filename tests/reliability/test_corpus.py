"""Runs every case of the reliability corpus (cases.py) as the real command.

Each case is ``python -m siirl.main_dag`` in a subprocess, in a fresh folder: the exit
status, the cause named at the end of stderr, no traceback anywhere, no ``.partial``
folder left behind, and the case's extra checks (committed checkpoints intact, each step
logged once, reward errors counted, ...). Cases rejected before anything loads (``fast``)
run with the default ``pytest``; the rest are marked ``reliability_slow`` and run in
``nox -s reliability`` (see conftest.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from cases import BASE, CASES, Case, Fault  # noqa: E402

TAIL_LINES = 12  # a failing run's cause must be named in its last lines of stderr
PR_CAPBSET_DROP = 24
# CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER: what lets root write a read-only folder
FILE_CAPS = (1, 2, 3)


def params():
    for case in CASES:
        marks = [] if case.fast else [pytest.mark.reliability_slow]
        yield pytest.param(case, id=case.id, marks=marks)


# ---------------------------------------------------------------------------------------
# running one command
# ---------------------------------------------------------------------------------------

def _env() -> dict:
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS="", PYTHONUNBUFFERED="1")
    env.pop("SIIRL_TRACEBACK", None)
    return env


def _preexec(case: Case):
    def setup() -> None:
        # Ctrl-C as a terminal's foreground job gets it: a test run started in the
        # background of a non-interactive shell ignores SIGINT, and exec keeps that
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        if case.unprivileged and os.geteuid() == 0:
            libc = ctypes.CDLL(None, use_errno=True)
            for cap in FILE_CAPS:  # gone from the bounding set: gone after exec
                libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        if case.file_size_limit:
            resource.setrlimit(resource.RLIMIT_FSIZE, (case.file_size_limit,) * 2)
    return setup


def _can_be_denied(case: Case, folder: Path) -> bool:
    """Whether a process started like the case's cannot write a read-only folder here
    (root without CAP_SETPCAP keeps its override, and the case would test nothing)."""
    probe = folder / "probe"
    probe.mkdir(mode=0o555)
    try:
        proc = subprocess.run([sys.executable, "-c", f"open({str(probe / 'x')!r}, 'w')"],
                              preexec_fn=_preexec(case), capture_output=True)
        return proc.returncode != 0
    finally:
        probe.chmod(0o755)
        shutil.rmtree(probe)


class Run:
    def __init__(self, returncode: int, out: str, err: str, at_fault: dict):
        self.returncode, self.out, self.err, self.at_fault = returncode, out, err, at_fault


def _train_lines(run: Path) -> int:
    try:
        return sum(1 for line in (run / "metrics.jsonl").read_text().splitlines()
                   if line.strip() and "val/" not in line)
    except OSError:
        return 0


def _workers(run: Path) -> list:
    try:
        return json.loads((run / "workers.json").read_text())
    except (OSError, ValueError):
        return []


def _ready(fault: Fault, run: Path, started: float, workers: int) -> bool:
    if fault.after_s is not None:
        return time.monotonic() - started >= fault.after_s
    if workers > 1 and len(_workers(run)) < workers:
        return False
    return _train_lines(run) >= fault.after_steps


def _fire(fault: Fault, proc: subprocess.Popen, run: Path) -> list:
    """Do the fault; returns the pids to SIGCONT afterwards."""
    if fault.action == "sigterm":
        os.kill(proc.pid, signal.SIGTERM)  # a scheduler stopping the job
    elif fault.action == "sigint":
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    elif fault.action == "sigint_twice":
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
    elif fault.action == "sigkill":
        os.kill(proc.pid, signal.SIGKILL)
    elif fault.action in ("stop_worker", "kill_worker"):
        victim = _workers(run)[1]["pid"]
        if fault.action == "stop_worker":
            os.kill(victim, signal.SIGSTOP)
            return [victim]
        os.kill(victim, signal.SIGKILL)
    else:
        raise AssertionError(f"unknown fault {fault.action}")
    return []


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_command(case: Case, argv: list, tmp: Path, run: Path, fault=None) -> Run:
    out_path, err_path = tmp / "stdout.txt", tmp / "stderr.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "siirl.main_dag", *argv], cwd=tmp,
                                stdout=out, stderr=err, env=_env(), start_new_session=True,
                                preexec_fn=_preexec(case))
    started = time.monotonic()
    at_fault: dict = {}
    stopped: list = []
    try:
        while proc.poll() is None:
            if fault is not None and not at_fault and _ready(fault, run, started,
                                                              case.workers):
                at_fault = committed(run)  # what the fault must not lose
                at_fault["_fired"] = True
                stopped = _fire(fault, proc, run)
            if time.monotonic() - started > case.timeout_s:
                _kill_group(proc.pid)
                proc.wait()
                pytest.fail(f"{case.id}: still running after {case.timeout_s:.0f} s\n"
                            + err_path.read_text()[-3000:])
            time.sleep(0.1)
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            _kill_group(proc.pid)
        proc.wait()
        if fault is not None and fault.action == "sigkill":
            _kill_group(proc.pid)  # what the killed driver left (pool processes)
    if fault is not None:
        assert at_fault, f"{case.id}: the run ended before its fault " \
                         f"({err_path.read_text()[-3000:]})"
        at_fault.pop("_fired")
    return Run(proc.returncode, out_path.read_text(errors="replace"),
               err_path.read_text(errors="replace"), at_fault)


# ---------------------------------------------------------------------------------------
# what a run leaves behind
# ---------------------------------------------------------------------------------------

def _digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def committed(run: Path) -> dict:
    """{checkpoint folder name: {file: sha1}} of the committed checkpoints."""
    if not run.is_dir():
        return {}
    out = {}
    for ckpt in sorted(run.glob("global_step_*")):
        try:
            if (ckpt / "COMMITTED").is_file():
                out[ckpt.name] = _digest(ckpt)
        except OSError:  # renamed or pruned while we read it
            continue
    return out


def train_steps(run: Path) -> list:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if not any(key.startswith("val/") for key in record):
            steps.append(record)
    return steps


def _tail(text: str, whole: bool) -> str:
    if whole:
        return text
    lines = [line for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-TAIL_LINES:])


def check_run(case: Case, result: Run, expected_exit, messages=()) -> None:
    shown = f"\n--- stderr (end) ---\n{result.err[-4000:]}"
    allowed = expected_exit if isinstance(expected_exit, tuple) else (expected_exit,)
    assert result.returncode in allowed, \
        f"{case.id}: exit {result.returncode}, expected {expected_exit}{shown}"
    assert "Traceback" not in result.err and "Traceback" not in result.out, \
        f"{case.id}: a traceback was printed{shown}"
    tail = _tail(result.err, case.whole_stderr or result.returncode == 0)
    for pattern in messages:
        assert re.search(pattern, tail, re.I | re.M), \
            f"{case.id}: the message does not match {pattern!r}{shown}"


def check_left_behind(case: Case, tmp: Path, run: Path, before: dict, result: Run,
                      argv: list) -> None:
    shown = f"\n--- stderr (end) ---\n{result.err[-3000:]}"
    if run.is_dir():
        partial = [p.name for p in run.glob(".*.partial")]
        assert not partial, f"{case.id}: left {partial} behind{shown}"
    after = committed(run)
    steps = train_steps(run)
    numbers = [r["step"] for r in steps]
    total = case.total_steps(argv)
    for check in case.checks:
        if check == "committed_intact":
            expected = {**before, **result.at_fault}
            for name, files in expected.items():
                if name in case.damaged:
                    continue
                assert name in after, f"{case.id}: committed {name} was lost{shown}"
                assert after[name] == files, f"{case.id}: committed {name} changed{shown}"
            if run.is_dir():
                for ckpt in run.glob("global_step_*"):
                    assert ckpt.name in case.damaged or (ckpt / "COMMITTED").is_file(), \
                        f"{case.id}: {ckpt.name} exists without COMMITTED{shown}"
        elif check == "steps_once":
            assert numbers == list(range(1, total + 1)), \
                f"{case.id}: metrics.jsonl has steps {numbers}, expected 1..{total} once"
        elif check in ("no_duplicates", "no_duplicates_so_far"):
            assert len(numbers) == len(set(numbers)), \
                f"{case.id}: a step is logged twice: {numbers}"
            if check == "no_duplicates":
                assert total in numbers, f"{case.id}: the run did not finish: {numbers}"
        elif check == "reward_errors":
            assert any(r.get("reward/errors", 0) > 0 for r in steps), \
                f"{case.id}: no step counted reward/errors{shown}"
            assert any(v > 0 for r in steps for k, v in r.items()
                       if k.startswith("reward/errors/")), \
                f"{case.id}: no reward/errors/<kind> was counted{shown}"
        elif check == "counted":
            assert sum(r.get("reward/errors", 0) + r.get("train/skipped_steps", 0)
                       for r in steps) > 0, \
                f"{case.id}: neither reward/errors nor train/skipped_steps counted it{shown}"
        elif check == "new_checkpoint":
            assert (run / f"global_step_{total}" / "COMMITTED").is_file(), \
                f"{case.id}: no committed checkpoint of step {total}{shown}"
        elif check == "no_code_ran":
            assert not (tmp / "PWNED").exists(), f"{case.id}: the checkpoint ran code"
        else:
            raise AssertionError(f"unknown check {check}")


# ---------------------------------------------------------------------------------------
# the test
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def seeded_run(tmp_path_factory) -> Path:
    """A run folder with committed checkpoints of steps 1 and 2 (copied by each case)."""
    tmp = tmp_path_factory.mktemp("seed")
    run = tmp / "run"
    argv = [a.format(run=run, tmp=tmp) for a in BASE] + ["trainer.save_freq=1"]
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag", *argv], cwd=tmp,
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(committed(run)) == ["global_step_1", "global_step_2"]
    return run


def _write_files(case: Case, tmp: Path) -> None:
    for name, content in case.files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def _restore_permissions(folder: Path) -> None:
    if folder.is_dir():
        for path in [folder, *folder.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)


@pytest.mark.parametrize("case", list(params()))
def test_case(case: Case, request) -> None:
    # short paths: Ray's socket paths live under the Ray folder
    tmp = Path(tempfile.mkdtemp(prefix=f"rel_{case.id[:20]}_", dir="/tmp"))
    run = tmp / "run"
    ray = tempfile.mkdtemp(prefix="ray", dir="/tmp") if case.workers > 1 else ""
    try:
        _write_files(case, tmp)
        if case.seed:
            shutil.copytree(request.getfixturevalue("seeded_run"), run)
        if case.unprivileged and not _can_be_denied(case, tmp):
            pytest.skip("this process cannot run a child without root's permission override")
        if case.damage is not None:
            run.mkdir(exist_ok=True)
            case.damage(run)
        before = committed(run)
        argv = case.argv_for(tmp, run, ray)
        result = run_command(case, argv, tmp, run, case.fault)
        check_run(case, result, case.exit, case.message)
        if case.then is not None:
            argv = case.argv_for(tmp, run, ray) + [a.format(tmp=tmp, run=run)
                                                   for a in case.then]
            before = {**before, **result.at_fault}
            result = run_command(case, argv, tmp, run)
            check_run(case, result, 0)
        check_left_behind(case, tmp, run, before, result, argv)
    finally:
        _restore_permissions(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        if ray:
            shutil.rmtree(ray, ignore_errors=True)


def test_corpus_covers_every_class_with_100_cases() -> None:
    from cases import CLASSES

    assert len(CASES) >= 100
    assert {case.kind for case in CASES} == set(CLASSES)
    assert any(case.fast for case in CASES)
