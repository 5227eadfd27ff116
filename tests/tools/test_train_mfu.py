"""tools/gpu/train_mfu.py: its CPU path (tiny Qwen2, both backends, one run) and, on a CUDA
machine, the full-size benchmark. Figures are recorded, never asserted as speeds."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools/gpu/train_mfu.py"
HAVE_MEGATRON = (importlib.util.find_spec("megatron") is not None
                 and importlib.util.find_spec("megatron.core") is not None)
# megatron's CPU adapters switch off where CUDA is present (the script then skips it)
MEGATRON_ON_CPU = HAVE_MEGATRON and not torch.cuda.is_available()
SEQ, ROWS = 64, 2


def run(tmp_path, *args, timeout):
    out = tmp_path / "mfu.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def by_backend(result):
    return {r["backend"]: r for r in result["results"]}


def batch_advantages():
    sys.path.insert(0, str(SCRIPT.parent))
    from mfu_engines import rollout_batch

    return rollout_batch(ROWS, SEQ, vocab=512)["advantages"]


def tiny_by_hand(seq):
    """(non-embedding parameters, FLOPs per token) of the --tiny shape, counted by hand:
    hidden 64, 2 layers, 4 heads of 16, 2 KV heads, intermediate 160, tied embeddings."""
    h, layers, inter, kv_dim = 64, 2, 160, 2 * 16
    attention = (h * h + h) + 2 * (h * kv_dim + kv_dim) + h * h  # q, k, v with bias; o
    mlp = 3 * h * inter  # gate, up, down
    n = layers * (attention + mlp + 2 * h) + h  # two RMSNorms per layer, the final norm
    return n, 6 * n + 12 * layers * h * seq


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One process for both backends: the imports cost more than the tiny steps."""
    backend = "both" if MEGATRON_ON_CPU else "fsdp"
    return run(tmp_path_factory.mktemp("mfu"), "--tiny", "--device", "cpu", "--steps", "2",
               "--seq", str(SEQ), "--rows", str(ROWS), "--backend", backend, "--profile", "3",
               timeout=300)


def check_trained(entry, result):
    assert "error" not in entry, entry.get("traceback")
    assert entry["measured_steps"] == 1 and len(entry["step_s"]) == 2
    assert entry["tokens_per_step"] == ROWS * SEQ
    assert entry["tokens_per_s"] > 0
    assert entry["flops_per_s_per_device"] == pytest.approx(
        entry["tokens_per_s"] * result["flops_per_token"])
    assert entry["mfu"] is None  # a CPU has no peak
    assert entry["peak_memory_gib"] > 0
    # on-policy, ratio 1: the policy loss is -mean(advantage) on any backend, so the update
    # ran on the batch the script built
    assert entry["pg_loss"] == pytest.approx(-float(batch_advantages().mean()), abs=1e-5)
    assert entry["grad_norm"] > 0


def test_cpu_json_records_the_run_and_the_flop_count(cpu_run):
    result, stdout = cpu_run
    n, per_token = tiny_by_hand(SEQ)
    assert result["model"]["nonembedding_params"] == n
    assert result["model"]["params"] == n + 512 * 64  # plus the (tied) embedding
    assert result["flops_per_token"] == per_token
    assert result["device"].startswith("cpu") and result["peak_flops_per_device"] is None
    assert {"date", "command", "machine"} <= set(result["run"])
    assert "--tiny" in result["run"]["command"]
    assert "tokens/s" in stdout and "MFU" in stdout


def test_fsdp_backend_trains_on_cpu(cpu_run):
    result, _ = cpu_run
    entry = by_backend(result)["fsdp"]
    check_trained(entry, result)
    assert entry["compute_dtype"] == "bf16 autocast"
    assert entry["activation_checkpointing"] is False  # the loader's rule on a CPU
    # --profile 3: one more step, profiled and not timed; its three costliest ops
    assert len(entry["step_s"]) == 2
    kernels = entry["profiled_step_costliest_kernels"]
    assert len(kernels) == 3 and kernels[0]["ms"] >= kernels[-1]["ms"] > 0
    assert 0 < sum(k["share"] for k in kernels) <= 1


@pytest.mark.skipif(not MEGATRON_ON_CPU, reason="megatron.core not importable, or CUDA "
                    "present (megatron's CPU path needs a machine without it)")
def test_megatron_backend_trains_on_cpu(cpu_run):
    result, _ = cpu_run
    entries = by_backend(result)
    check_trained(entries["megatron"], result)
    assert entries["megatron"]["compute_dtype"] == "bf16"  # --megatron-dtype's default
    # same model, same batch: the same loss as the fsdp engine
    assert entries["megatron"]["pg_loss"] == pytest.approx(entries["fsdp"]["pg_loss"],
                                                           abs=1e-4)


@pytest.mark.parametrize("script", [SCRIPT, SCRIPT.with_name("megatron_fsdp_logprobs.py")],
                         ids=["train_mfu", "megatron_fsdp_logprobs"])
def test_full_size_without_a_gpu_is_refused_in_one_line(script, tmp_path):
    proc = subprocess.run([sys.executable, str(script), "--device", "cpu",
                           "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stdout.strip().count("\n") == 0 and "needs a CUDA GPU" in proc.stdout
    assert not (tmp_path / "x.json").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_full_size_bench_on_gpu(tmp_path):
    """Qwen2.5-0.5B shape, seq 4096, both backends (megatron where installed)."""
    result, stdout = run(tmp_path, "--steps", "3", timeout=3600)
    print(stdout)  # the table, for the log (-s)
    assert result["model"]["params"] == 494_032_768  # Qwen2.5-0.5B's parameter count
    assert result["flops_per_token"] == 6 * 357_898_112 + 12 * 24 * 896 * 4096
    entries = by_backend(result)
    for name, entry in entries.items():
        if name == "megatron" and not HAVE_MEGATRON:
            assert "skipped" in entry
            continue
        assert "error" not in entry, entry.get("traceback")
        assert entry["tokens_per_s"] > 0 and entry["peak_memory_gib"] > 0
        if result["peak_flops_per_device"]:  # a GPU in the peak table (or --peak)
            assert 0 < entry["mfu"] < 1
