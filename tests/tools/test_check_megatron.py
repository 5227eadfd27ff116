"""tools/gpu/check_megatron.py's CPU dry run (``--cpu``): every part of the GPU check runs at
tiny size (fp32 parity, the MoE's bf16 parity, GRPO in fp32, bf16, fp16, MoE bf16 and MoE
bf16 with router replay R2), passes,
and writes its JSON. Speeds are recorded, never asserted."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from siirl_suites import megatron_full

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools/gpu/check_megatron.py"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None or torch.cuda.is_available(),
    reason="needs megatron-core; on a CUDA machine the script runs for real, not dry")


@megatron_full  # and the GPU dry run (nox -s gpu_dry_run) runs the same script
def test_cpu_dry_run_checks_dense_and_moe_in_bf16(tmp_path):
    out = tmp_path / "megatron_gpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--steps", "2", "--batch", "8",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    moe = report["moe_parity_bf16"]
    assert moe["round_trip_bit_exact"] and 0 < moe["logprob_max_abs_diff"] <= moe["tolerance"]
    for key in ("grpo", "grpo_bf16", "grpo_fp16", "grpo_moe_bf16", "grpo_moe_bf16_r2"):
        assert report[key]["losses_finite"] and report[key]["actor_tokens_per_s"] > 0, key
    assert "GRPO MoE bf16 actor tokens/s" in proc.stdout
