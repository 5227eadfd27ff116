"""tools/gpu/megatron_fsdp_logprobs.py: its CPU path (tiny Qwen2, all four engines in one
process) agrees, its checks fail on a real mismatch, and without CUDA the full size is
refused in one line."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools/gpu/megatron_fsdp_logprobs.py"
HAVE_MEGATRON = (importlib.util.find_spec("megatron") is not None
                 and importlib.util.find_spec("megatron.core") is not None)
# megatron's CPU adapters switch off where CUDA is present (the script then refuses)
needs_megatron_on_cpu = pytest.mark.skipif(
    not HAVE_MEGATRON or torch.cuda.is_available(),
    reason="megatron.core not importable, or CUDA present (megatron's CPU path needs a "
           "machine without it)")
CASES = {"fsdp fp32", "megatron fp32", "fsdp bf16", "megatron bf16"}


def script_module():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("megatron_fsdp_logprobs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("logprobs") / "logprobs.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--device", "cpu",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


@needs_megatron_on_cpu
def test_cpu_run_has_every_case_and_passes(cpu_run):
    result, stdout = cpu_run
    cases = {c["case"]: c for c in result["cases"]}
    assert set(cases) == CASES
    for case in cases.values():
        assert "error" not in case, case.get("traceback")
        assert case["finite"]
        # a random model's log-probs sit near -log(vocab)
        assert case["mean_log_prob"] == pytest.approx(-torch.log(torch.tensor(512.)).item(),
                                                      abs=1.0)
    assert result["passed"] is True and "passed" in stdout
    assert result["response_tokens"] == 2 * 32  # 2 rows x half of 64 tokens
    assert result["versions"]["megatron-core"] and result["versions"]["torch"]
    assert {"date", "command"} <= set(result["run"])
    assert result["model"]["vocab"] == 512 and result["model"]["hidden"] == 64


@needs_megatron_on_cpu
def test_fp32_engines_agree_to_fp32_rounding(cpu_run):
    result, _ = cpu_run
    fp32 = result["checks"]["fp32"]
    eps = torch.finfo(torch.float32).eps
    assert fp32["tolerance_max_abs"] == 8192 * eps
    assert fp32["passed"] and fp32["max_abs"] <= fp32["tolerance_max_abs"]
    # on the CPU the two fp32 forwards are far closer than the tolerance allows
    assert fp32["mean_abs"] <= 64 * eps * 12


@needs_megatron_on_cpu
def test_bf16_errors_are_bf16_sized_and_within_the_rule(cpu_run):
    result, _ = cpu_run
    bf16 = result["checks"]["bf16"]
    fsdp = bf16["fsdp_bf16_vs_fsdp_fp32"]["mean_abs"]
    megatron = bf16["megatron_bf16_vs_fsdp_fp32"]["mean_abs"]
    assert bf16["passed"] and megatron <= 2 * fsdp + bf16["epsilon"]
    # bf16 really ran: its error is above fp32 rounding, below a bf16 rounding of -log(512)
    for err in (fsdp, megatron, bf16["megatron_bf16_vs_fsdp_bf16"]["mean_abs"]):
        assert 1e-5 < err < 2.0 ** -8 * 6.3


def test_checks_fail_on_a_mismatch():
    module = script_module()
    g = torch.Generator().manual_seed(0)
    ref = -6.0 + 0.2 * torch.randn(2, 8, generator=g)
    mask = torch.ones(2, 8, dtype=torch.bool)
    noise = 1e-3 * torch.randn(2, 8, generator=g)
    good = {"fsdp fp32": ref, "megatron fp32": ref + 1e-6, "fsdp bf16": ref + noise,
            "megatron bf16": ref - noise}
    checks = module.compare(good, mask)
    assert checks["fp32"]["passed"] and checks["bf16"]["passed"]
    shifted = dict(good, **{"megatron fp32": ref + 1e-2})  # e.g. a wrong norm eps
    assert not module.compare(shifted, mask)["fp32"]["passed"]
    noisy = dict(good, **{"megatron bf16": ref + 10 * noise})
    assert not module.compare(noisy, mask)["bf16"]["passed"]
    # a case that did not run leaves its check out (the script then fails)
    assert set(module.compare({"fsdp fp32": ref}, mask)) == set()

