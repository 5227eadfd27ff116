"""tools/bench/run_summary.py: the README's main-job numbers from a run's metrics.jsonl."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools/bench/run_summary.py"


def test_summary_of_a_run(tmp_path):
    records = [{"step": 0, "val/score/mean": 0.3, "timing_s/validation": 1.0}]
    records += [{"step": s, "timing_s/step": 0.1 * s, "critic/score/mean": 0.5}
                for s in range(1, 11)]
    records += [{"step": 5, "val/score/mean": 0.9, "timing_s/validation": 1.0},
                {"step": 10, "val/score/mean": 0.7, "timing_s/validation": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)))
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--wall-s", "12.5"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 10 and abs(summary["step_s_median"] - 0.55) < 1e-9
    assert (summary["val_first"], summary["val_best"], summary["val_best_step"],
            summary["val_last"]) == (0.3, 0.9, 5, 0.7)
    assert summary["validation_total_s"] == 3.0 and summary["wall_s"] == 12.5
    assert "step_s_median" in proc.stdout
