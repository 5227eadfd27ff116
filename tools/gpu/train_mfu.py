"""Training throughput and model FLOPs utilisation of siiRL's actor update, per backend.

    .venv/bin/python tools/gpu/train_mfu.py [--backend fsdp|megatron|both] [--seq 4096] \
        [--rows 8] [--micro 1] [--steps 4] [--peak FLOPS] [--out train_mfu.json]
    .venv/bin/python tools/gpu/train_mfu.py --tiny --device cpu --steps 2 --seq 64 --rows 2

A randomly initialised Qwen2.5-0.5B-shaped model (transformers ``Qwen2Config``; no
download) is trained by siiRL's own actor engines on a synthetic rollout batch of ``--rows``
full-length sequences of ``--seq`` tokens (half prompt, half response), ``--micro`` rows
per micro-batch, one optimizer step per ``update_policy`` call:

* ``fsdp``: ``siirl.engine.fsdp.engines.fsdp_actor`` with the module injected, bf16
  autocast over fp32 master weights (``fsdp_config.model_dtype=bf16``), activation
  checkpointing as the model loader sets it (on for CUDA; ``--checkpointing``). With one
  rank siiRL trains the module unsharded; under ``torchrun --nproc_per_node N`` it is
  FSDP2-sharded over the N ranks.
* ``megatron``: ``siirl.engine.megatron.engines.megatron_actor`` (megatron-core GPTModel,
  DDP + distributed optimizer), ``--megatron-dtype`` (default bfloat16: bf16 weights and
  compute over fp32 main weights; float32 with ``--tf32`` allows TF32 matmuls). Needs
  ``pip install "siirl-engine[megatron]"``.

The first step is a warm-up. FLOPs per token = 6 N_nonembedding + 12 layers hidden seq;
MFU = achieved FLOP/s per device / the device's dense bf16 peak (H100, H200: 989e12;
A100: 312e12; ``--peak`` overrides, e.g. 756e12 for an H100 PCIe). On a CPU there is no
peak: achieved FLOP/s only. Prints a table and writes JSON (device, date, command line).
Without CUDA it needs ``--tiny`` (a small model of the same family, for the CPU check).

The step-vs-floor benchmark tools/bench/step_floor.py runs on CUDA as it is: it builds the
real worker on ``trainer.device`` (default auto: CUDA when present) and its floor step
runs on the same device as the policy. tools/gpu/step_floor_gpu.sh runs it with
``trainer.device=cuda`` and lists its caveats there.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "bench"))

import torch  # noqa: E402
from bench_info import run_facts  # noqa: E402
from mfu_engines import (  # noqa: E402
    checkpoint_activations,
    engine_config,
    fsdp_actor_engine,
    megatron_actor_engine,
    rollout_batch,
)
from mfu_model import (  # noqa: E402
    build_model,
    flops_per_token,
    nonembedding_params,
    peak_flops,
    qwen2_config,
)

NEEDS_GPU = "train_mfu.py needs a CUDA GPU for the full-size model (or --tiny for the CPU check)"
MEGATRON_PIP = 'pip install "siirl-engine[megatron]"'


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("fsdp", "megatron", "both"), default="both")
    parser.add_argument("--seq", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--rows", type=int, default=8, help="sequences per step (per rank)")
    parser.add_argument("--micro", type=int, default=1, help="rows per micro-batch")
    parser.add_argument("--steps", type=int, default=4, help="update steps; the first warms up")
    parser.add_argument("--tiny", action="store_true", help="small model of the same family")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="default: cuda when available")
    parser.add_argument("--peak", type=float, default=None, help="peak FLOP/s per device")
    parser.add_argument("--checkpointing", choices=("auto", "on", "off"), default="auto",
                        help="fsdp activation checkpointing (auto: the model loader's rule)")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 matmuls (CUDA)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="after the timed steps, profile one more with torch.profiler and "
                             "keep its N costliest ops (self device time) in the JSON")
    parser.add_argument("--megatron-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="megatron.dtype of the megatron actor")
    parser.add_argument("--out", default="train_mfu.json")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is a warm-up)")
    if args.rows < 1 or args.micro < 1 or args.rows % args.micro:
        parser.error(f"--micro {args.micro} must divide --rows {args.rows}")
    if args.seq < 4:
        parser.error("--seq must be at least 4")
    return args


def init_distributed(device: torch.device) -> tuple:
    """(rank, world size): torchrun's ranks, else one process that inits nothing (the
    megatron engine starts its own world of one)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    import torch.distributed as dist

    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), world


def megatron_unavailable(device: torch.device) -> Optional[str]:
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        return f"megatron-core is not installed ({MEGATRON_PIP})"
    if device.type == "cpu" and torch.cuda.is_available():
        # its CPU adapters switch off (and its process group is NCCL) where CUDA is present
        return "megatron on the CPU runs only on a machine without CUDA"
    return None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    # Linux reports KiB; on the CPU this is the whole process so far, not one backend
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def build_engine(backend: str, args, device: torch.device, world: int, hf_config):
    model = build_model(hf_config, device)
    cfg = engine_config(backend, args.rows, args.micro, device.type, world, args.megatron_dtype)
    if backend == "megatron":  # megatron's GPT is built without activation recompute
        dtype = {"bfloat16": "bf16", "float32": "fp32"}[args.megatron_dtype]
        return megatron_actor_engine(model, cfg), dtype + (" tf32" if args.tf32 else ""), False
    from siirl.engine.models.loader import checkpoints_activations

    setting = {"auto": None, "on": True, "off": False}[args.checkpointing]
    checkpointing = checkpoints_activations(setting, device.type)
    if checkpointing:
        checkpoint_activations(model)
    return fsdp_actor_engine(model, cfg), "bf16 autocast", checkpointing


def measure(backend: str, args, device: torch.device, world: int, hf_config,
            per_token: int, peak: Optional[float]) -> dict:
    """Step times of ``args.steps`` updates; rates over all steps but the first."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    engine, dtype, checkpointing = build_engine(backend, args, device, world, hf_config)
    # every rank trains the same rows: throughput does not depend on the token values
    batch = rollout_batch(args.rows, args.seq, hf_config.vocab_size)
    seconds, metrics, kernels = [], {}, None
    # a profiled step runs after the timed ones (the profiler's overhead is not timed)
    for step in range(args.steps + (1 if args.profile else 0)):
        step_batch = batch.clone()  # the update adds fields; each step starts the same
        profiling = step == args.steps
        profiler = costliest_kernels(device) if profiling else contextlib.nullcontext()
        with profiler as found:
            sync(device)
            start = time.perf_counter()
            step_metrics = engine.update_policy(step_batch).metrics
            sync(device)
            elapsed = time.perf_counter() - start
        if profiling:
            kernels = found.top(args.profile)
        else:
            seconds.append(elapsed)
            metrics = step_metrics
    tokens_per_step = args.rows * args.seq * world
    measured = seconds[1:]
    tokens_per_s = tokens_per_step * len(measured) / sum(measured)
    flops_per_s = tokens_per_s * per_token / world  # per device
    return {
        "backend": backend, "compute_dtype": dtype,
        "activation_checkpointing": checkpointing,
        "fsdp2_sharded": bool(getattr(engine.backend, "sharded", False)),
        "step_s": seconds, "measured_steps": len(measured),
        "tokens_per_step": tokens_per_step, "tokens_per_s": tokens_per_s,
        "flops_per_s_per_device": flops_per_s,
        "mfu": flops_per_s / peak if peak else None,
        "peak_memory_gib": peak_memory_gib(device),
        "memory": ("torch.cuda.max_memory_allocated" if device.type == "cuda"
                   else "process max RSS"),
        "pg_loss": metrics.get("actor/pg_loss"), "grad_norm": metrics.get("actor/grad_norm"),
        **({"profiled_step_costliest_kernels": kernels} if kernels is not None else {}),
    }


class costliest_kernels:  # noqa: N801  (a context manager, used like a function)
    """torch.profiler around one step; ``top(n)``: the n operators (host-side events, each
    with the device time of the kernels it launched itself; the kernel events are left out,
    which would count that time twice) of most self device time (the CPU's self time on a
    CPU), with their share of the step's total."""

    def __init__(self, device: torch.device):
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + \
            ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        self.profile = profile(activities=activities)

    def __enter__(self):
        self.profile.__enter__()
        return self

    def __exit__(self, *exc):
        return self.profile.__exit__(*exc)

    def top(self, n: int) -> list:
        from torch.autograd import DeviceType

        events = [e for e in self.profile.key_averages()
                  if e.device_type == DeviceType.CPU and getattr(e, self.attr) > 0]
        total = sum(getattr(e, self.attr) for e in events) or 1.0
        events.sort(key=lambda e: getattr(e, self.attr), reverse=True)
        return [{"name": e.key[:120], "calls": e.count, "ms": getattr(e, self.attr) / 1e3,
                 "share": getattr(e, self.attr) / total} for e in events[:n]]


def run_backend(backend: str, args, device, world, hf_config, per_token, peak) -> dict:
    """One backend's result, or its error (so one failing backend keeps the other's)."""
    reason = megatron_unavailable(device) if backend == "megatron" else None
    if reason:
        return {"backend": backend, "skipped": reason}
    try:
        return measure(backend, args, device, world, hf_config, per_token, peak)
    except Exception as err:  # noqa: BLE001  (out of memory included: report and go on)
        return {"backend": backend, "error": f"{type(err).__name__}: {err}"[:2000],
                "traceback": traceback.format_exc()[-4000:]}
    finally:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def report(result: dict) -> None:
    print(f"{result['device']}, seq {result['seq']}, {result['rows']} rows x {result['world_size']}"
          f" rank(s), micro {result['micro']}, {result['flops_per_token']:.4g} FLOP/token")
    print(f"{'backend':<26}{'tokens/s':>12}{'TFLOP/s':>10}{'MFU':>9}{'peak mem GiB':>14}")
    for r in result["results"]:
        if "tokens_per_s" not in r:
            print(f"{r['backend']:<26}{r.get('skipped') or r.get('error')}")
            continue
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        print(f"{r['backend'] + ' (' + r['compute_dtype'] + ')':<26}{r['tokens_per_s']:>12.0f}"
              f"{r['flops_per_s_per_device'] / 1e12:>10.3g}{mfu:>9}"
              f"{r['peak_memory_gib']:>14.2f}")


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    kind = args.device or ("cuda" if cuda else "cpu")
    if (kind == "cuda" and not cuda) or (kind == "cpu" and not args.tiny):
        print(NEEDS_GPU)
        return 2
    if kind == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
    device = torch.device(kind, torch.cuda.current_device()) if kind == "cuda" else \
        torch.device("cpu")
    backends = ["fsdp", "megatron"] if args.backend == "both" else [args.backend]
    if args.backend == "megatron" and megatron_unavailable(device):
        print(f"train_mfu.py --backend megatron: {megatron_unavailable(device)}")
        return 2
    rank, world = init_distributed(device)
    hf_config = qwen2_config(args.tiny, args.seq)
    probe = build_model(hf_config, torch.device("meta"))  # counts parameters, holds none
    n_nonemb = nonembedding_params(probe)
    per_token = flops_per_token(n_nonemb, hf_config.num_hidden_layers, hf_config.hidden_size,
                                args.seq)
    name = torch.cuda.get_device_name(device) if kind == "cuda" else \
        f"cpu ({platform.processor() or platform.machine()})"
    peak = peak_flops(name, args.peak)
    result = {
        "run": run_facts(argv), "device": name, "world_size": world,
        "model": {"shape": "tiny qwen2" if args.tiny else "Qwen2.5-0.5B",
                  "hidden": hf_config.hidden_size, "layers": hf_config.num_hidden_layers,
                  "heads": hf_config.num_attention_heads,
                  "kv_heads": hf_config.num_key_value_heads,
                  "intermediate": hf_config.intermediate_size,
                  "vocab": hf_config.vocab_size, "tied_embeddings": True,
                  "params": sum(p.numel() for p in probe.parameters()),
                  "nonembedding_params": n_nonemb},
        "seq": args.seq, "response_length": args.seq // 2, "rows": args.rows,
        "micro": args.micro, "steps": args.steps, "tf32": args.tf32,
        "flops_per_token": per_token,
        "flops_formula": "6 * nonembedding_params + 12 * layers * hidden * seq",
        "peak_flops_per_device": peak,
        "peak_source": "--peak" if args.peak else ("bf16 dense, by device name" if peak
                                                   else None),
        "results": [],
    }
    del probe
    for backend in backends:
        result["results"].append(run_backend(backend, args, device, world, hf_config,
                                             per_token, peak))
    failed = [r for r in result["results"] if "error" in r
              or (r.get("grad_norm") is not None and not math.isfinite(r["grad_norm"]))]
    if rank == 0:
        report(result)
        for r in failed:
            print(f"\n{r['backend']} failed:\n{r.get('traceback', r)}")
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
