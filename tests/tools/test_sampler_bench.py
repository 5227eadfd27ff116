"""tools/bench/sampler.py times generate, the plain loop and the rollout's sampler on the
same batches, and checks the sampler's tokens against the plain loop's (figures only;
speed is never asserted in tests)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools/bench/sampler.py"


def test_sampler_bench_reports_every_method_and_identical_tokens(tmp_path):
    out = tmp_path / "sampler.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "3", "--rows", "16",
                           "--n", "4", "--new-tokens", "4", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert (result["rows"], result["n"], result["new_tokens"]) == (16, 4, 4)
    assert result["rounds_measured"] == 2
    assert result["sampler_equals_reference"] == {"rounds": 3, "identical": 3}
    assert set(result["methods"]) == {"generate", "reference", "sampler", "rollout node"}
    for row in result["methods"].values():
        assert row["median_s"] > 0 and row["tokens_per_s"] > 0 and row["ratio_to_generate"] > 0
    assert "/ generate" in proc.stdout
