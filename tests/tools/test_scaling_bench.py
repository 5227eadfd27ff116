"""tools/bench/scaling.py: its machine probe and one job run (the 2-worker comparison
itself is what the benchmark is for; the multi-worker path is tested in tests/e2e)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("scaling", ROOT / "tools/bench/scaling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_probe_times_one_process_and_two_at_once():
    result = load().probe(iterations=3)
    assert result["alone_s"] > 0 and result["together_s"] > 0
    assert result["efficiency"] == result["alone_s"] / result["together_s"]


def test_one_worker_run_reports_step_nodes_and_start_up():
    run = load().run_job(1, steps=3, per_worker=4, timeout=300,
                         overrides=["actor_rollout_ref.rollout.n=2"])
    assert run["steps_measured"] == 1 and run["step_s"] > 0
    assert run["cpu_per_step_s"] is None or run["cpu_per_step_s"] >= 0  # None: no /proc
    assert {"rollout_actor", "actor_train", "step"} <= set(run["nodes"])
    assert run["to_first_step_s"] > 0 and run["databuffer_bytes"] == 0
