"""tools/bench/startup.py runs the real command in fresh processes and splits its time to
the first step (figures only; speed is never asserted in tests)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools/bench/startup.py"


def test_startup_bench_reports_the_parts_of_the_time_to_the_first_step(tmp_path):
    out = tmp_path / "startup.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--runs", "1", "--workers", "1",
                           "--out", str(out), "data.train_batch_size=8",
                           "actor_rollout_ref.rollout.n=2",
                           "actor_rollout_ref.actor.ppo_mini_batch_size=8"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    median = json.loads(out.read_text())["workers"]["1"]["median"]
    parts = ("start", "setup", "validation", "first_step")
    assert all(median[key] >= 0 for key in parts)
    assert abs(sum(median[key] for key in parts) - median["to_first_step"]) < 1e-6
    assert median["command"] >= median["to_first_step"] and median["command_cpu"] > 0
    assert "to step 1" in proc.stdout
