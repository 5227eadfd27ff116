"""Check asynchronous training's weight channel on GPUs: trainer rank 0 broadcasts its
weights, bucket by bucket, to a rollout process over NCCL (``siirl.dag_worker.
async_training.wire.WeightGroups``), then a short asynchronous GRPO run on two GPUs.

    python tools/gpu/async_weight_sync_check.py [--out async_sync.json]   # 2+ GPUs
    python tools/gpu/async_weight_sync_check.py --cpu                     # gloo, here

1. channel: 2 processes (trainer on cuda:0, rollout on cuda:1) send a 0.5B-shaped set
   of bf16 and fp32 tensors in 64 MB buckets; every tensor must arrive bit-exact; the
   bandwidth is reported (GB/s);
2. run: ``siirl-train async_training.enable=true`` with one trainer and one rollout GPU,
   20 steps, staleness 1: every step logs its policy lag (at most 1) and the bytes synced.

NCCL cannot join two processes on one GPU: with a single GPU the check says so and runs
the channel over gloo between cuda:0 and the CPU instead (exit 0, ``"nccl": false``).
Prints one line per check, writes JSON; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
# the 0.5B-shaped model's tensors (Qwen2.5-0.5B: hidden 896, 24 layers, vocab 151936)
SHAPES = [("embed", (151936, 896))] + [
    (f"layers.{i}.{name}", shape) for i in range(24)
    for name, shape in (("qkv", (1152, 896)), ("o", (896, 896)), ("up_gate", (9728, 896)),
                        ("down", (896, 4864)), ("norm", (896,)))]


def _tensors(device: torch.device, scale: int) -> list:
    gen = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for name, shape in SHAPES:
        shape = tuple(max(1, s // scale) for s in shape)
        dtype = torch.float32 if name.endswith("norm") else torch.bfloat16
        out.append((name, torch.randn(shape, generator=gen).to(dtype).to(device)))
    return out


def _buckets(tensors: list, bucket_bytes: int) -> list:
    from siirl.engine.common.weight_sync import buckets_of

    return list(buckets_of(tensors, bucket_bytes))


def _rank(rank: int, port: int, backend: str, scale: int, result: dict) -> None:
    import datetime

    import torch.distributed as dist

    from siirl.dag_worker.async_training.groups import build_groups

    on_gpu = backend == "nccl"
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=300))
    groups = build_groups(rank, [0], [1], backend, 300, device)
    want = _tensors(device, scale)
    if rank == 0:
        buckets = _buckets(want, 64 << 20)
        for _ in range(2):  # the first round warms NCCL up
            if on_gpu:
                torch.cuda.synchronize()
            start = time.perf_counter()
            sent = groups.weights.send(buckets, {"version": 1})
            if on_gpu:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        result.update(bytes=sent, seconds=seconds, gbps=sent / seconds / 1e9,
                      buckets=len(buckets))
    else:
        for _ in range(2):
            notes, buckets = groups.weights.receive()
        got = [item for bucket in buckets for item in bucket]
        exact = len(got) == len(want) and all(
            a == b and torch.equal(x, y) for (a, x), (b, y) in zip(got, want, strict=True))
        result.update(exact=bool(exact), version=notes["version"])
    dist.barrier()
    dist.destroy_process_group()


def _rank_main(rank: int, port: int, backend: str, scale: int, path: str) -> None:
    result: dict = {}
    _rank(rank, port, backend, scale, result)
    Path(f"{path}.{rank}").write_text(json.dumps(result))


def channel(backend: str, scale: int) -> dict:
    from siirl.execution.scheduler.process_group_manager import free_port

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "rank")
        mp.start_processes(_rank_main, args=(free_port(), backend, scale, path), nprocs=2,
                           join=True, start_method="spawn")
        sender = json.loads(Path(f"{path}.0").read_text())
        receiver = json.loads(Path(f"{path}.1").read_text())
    return {"backend": backend, **sender, **receiver, "ok": bool(receiver.get("exact"))}


def async_run(device: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as run:
        cmd = [sys.executable, "-m", "siirl.main_dag", "async_training.enable=true",
               "async_training.staleness_threshold=1", f"trainer.device={device}",
               "trainer.ray_address=local", f"trainer.total_training_steps={steps}",
               "trainer.test_freq=-1", "trainer.logger=[]", f"trainer.default_local_dir={run}"]
        env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS="")
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            return {"ok": False, "error": proc.stderr[-2000:]}
        records = [json.loads(line) for line in Path(run, "metrics.jsonl").read_text()
                   .splitlines() if '"critic/score/mean"' in line]
    lags = [r["async/policy_lag/max"] for r in records]
    synced = [r.get("weight_sync/bytes", 0) for r in records]
    return {"ok": len(records) == steps and max(lags) <= 1 and min(synced) > 0,
            "steps": len(records), "lag_max": max(lags), "wall_s": wall,
            "weight_sync_s": sum(r["timing_s/weight_sync"] for r in records) / len(records),
            "step_s": sorted(r["timing_s/step"] for r in records)[len(records) // 2]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="gloo on the CPU (a dry run)")
    parser.add_argument("--out", default="async_sync.json")
    args = parser.parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = gpus >= 2 and not args.cpu
    report = {"gpus": gpus, "nccl": nccl}
    if not nccl and not args.cpu:
        print(f"async_sync: NCCL needs two GPUs (this machine has {gpus}): the channel runs "
              "over gloo, the two-GPU run is skipped", flush=True)
    report["channel"] = channel("nccl" if nccl else "gloo", 1 if nccl else 16)
    print("channel:", json.dumps(report["channel"]), flush=True)
    if nccl or args.cpu:
        report["run"] = async_run("cuda" if nccl else "cpu", 20 if nccl else 4)
        print("run:", json.dumps({k: v for k, v in report["run"].items() if k != "error"}),
              flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    ok = report["channel"]["ok"] and report.get("run", {"ok": True})["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
