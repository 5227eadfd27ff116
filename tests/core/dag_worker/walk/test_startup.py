"""Start-up: garbage collection relaxed while libraries load, frozen after set-up (only in a
process that asked for it), the job's start time, and the first step's start-up metrics."""

import gc
import json
import subprocess
import sys
import time

import siirl_dagworker_helpers as h
from siirl.dag_worker.dagworker import DAGWorker
from siirl.dag_worker.walk import startup
from siirl.dag_worker.walk.trainer_loop import Trainer
from siirl.execution.dag.pipeline import Pipeline


def _python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_relax_then_settle_freezes_and_restores_the_thresholds():
    # in a child: freezing this test process's objects is not the test's to do
    out = _python(
        "import gc, json\n"
        "from siirl.dag_worker.walk import startup\n"
        "before = gc.get_threshold()\n"
        "startup.relax(); startup.relax()  # a second call keeps the first saved values\n"
        "relaxed = gc.get_threshold()\n"
        "startup.settle()\n"
        "print(json.dumps([before, relaxed, gc.get_threshold(), gc.get_freeze_count()]))\n")
    before, relaxed, after, frozen = json.loads(out)
    assert relaxed == list(startup.STARTUP_THRESHOLDS) and relaxed[0] > before[0]
    assert after == before and frozen > 0


def test_settle_without_relax_leaves_the_process_alone():
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    startup.settle()
    assert gc.get_threshold() == thresholds and gc.get_freeze_count() == frozen


def test_process_started_is_when_the_process_began():
    code = ("import time\n"
            "time.sleep(0.3)\n"
            "from siirl.dag_worker.walk.startup import process_started\n"
            "print(process_started(), time.time())\n")
    before = time.time()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    forked = time.time()  # the child exists (and started) by now
    started, now = map(float, proc.communicate(timeout=60)[0].split())
    tick = 0.02  # /proc counts in clock ticks (10 ms)
    assert before - tick <= started <= forked + tick and started < now


def _graph():
    return Pipeline("g").add_node("src", func="siirl_dagworker_helpers:source").build()


def test_the_first_step_records_start_up_once(tmp_path):
    config = {"trainer": {"total_training_steps": 3, "default_local_dir": str(tmp_path),
                          "logger": [], "save_freq": -1}}
    h.CALLS.clear()
    started = time.time() - 5.0  # the job began before this process
    history = Trainer(DAGWorker(_graph(), config), started_at=started).fit()
    h.CALLS.clear()
    first, *rest = [m for m in history if "timing_s/step" in m]
    assert first["timing_s/to_first_step"] >= 5.0 + first["timing_s/step"]
    assert 0.0 <= first["timing_s/setup"] < first["timing_s/to_first_step"] - 5.0
    assert rest and not any("timing_s/to_first_step" in m or "timing_s/setup" in m
                            for m in rest)
