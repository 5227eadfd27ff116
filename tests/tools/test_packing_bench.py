"""tools/bench/packing.py times the padded and packed actor forward + backward side by side
and checks that both give the same log-probs (figures only; speed is never asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import torch

from siirl_numerics import rounding, transformer_terms

SCRIPT = Path(__file__).resolve().parents[2] / "tools/bench/packing.py"


def test_packing_bench_reports_both_layouts_and_equal_log_probs(tmp_path):
    out = tmp_path / "packing.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rows", "8", "--long", "1",
                           "--micro", "4", "--rounds", "1", "--models", "tiny",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (case,) = json.loads(out.read_text())["cases"]
    assert case["model"] == "tiny"
    # padded and packed rows sum the same terms in another order: float32 rounding of the
    # tiny model's reductions over the padded width, at the size of the log-probs
    from siirl.engine.models.loader import load_model
    from siirl.params import ModelArguments

    config = load_model(ModelArguments(path=None)).config
    tol = rounding(torch.float32, transformer_terms(config, case["width"]),
                   case["max_abs_logprob"], case["attended_tokens"])
    assert case["max_abs_logprob_diff"] <= tol.atol, (case["max_abs_logprob_diff"], str(tol))
    assert case["tokens_run"]["packed"] == case["attended_tokens"]
    assert case["tokens_run"]["packed"] < case["tokens_run"]["padded"] <= case["batch_tokens"]
    assert case["median_s"]["padded"] > 0 and case["median_s"]["packed"] > 0
    assert "packed/padded" in proc.stdout
