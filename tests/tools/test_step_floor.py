"""tools/bench/step_floor.py runs the real step and its floor side by side and reports
their ratio (figures only; speed is never asserted in tests)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools/bench/step_floor.py"


def test_step_floor_reports_nodes_floor_parts_and_ratio(tmp_path):
    out = tmp_path / "floor.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "3", "--out", str(out),
                           "data.train_batch_size=8", "actor_rollout_ref.rollout.n=2",
                           "actor_rollout_ref.actor.ppo_mini_batch_size=8"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["rounds_measured"] == 2 and result["ratio_median"] > 0
    assert {"rollout_actor", "actor_train", "function_reward"} <= set(result["nodes"])
    assert result["floor"]["generate"] > 0 and result["floor"]["train"] > 0
    assert result["startup_s"]["to_first_step"] > 0 and result["peak_rss_mb"] > 0
    assert "siiRL step / floor step" in proc.stdout
