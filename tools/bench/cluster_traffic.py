"""What crosses the network per training step when the workers sit on two nodes.

    python tools/bench/cluster_traffic.py [--steps 6] [--out docs/bench/cluster_traffic.json] \
        [key=value ...]

The same GRPO job (2 CPU workers, the rollout at tensor-parallel size 2 so the DataBuffer
moves rows between the workers) runs twice, side by side:

- one node: both workers on a private local Ray node;
- two nodes: a Ray cluster of two nodes on this machine (``ray.cluster_utils.Cluster``,
  both on 127.0.0.1, 1 CPU each), one worker per node (``trainer.nnodes=2``).

Per run, from the run's ``metrics.jsonl`` (means over the steps): the DataBuffer's rows
sent over the transport (gloo) and through shared memory, and the weight-sync bytes (the
FSDP shards gathered into the rollout's full copy); and from the kernel's loopback counters
(``/proc/net/dev``, everything between the processes: gloo collectives of FSDP, the
DataBuffer, Ray's control traffic) the bytes per step between the first and the last
step's log line. The driver never receives batch data: its traffic is Ray's control
messages and rank 0's metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_info import write_result  # tools/bench is on sys.path when run as a script

JOB = ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
       "actor_rollout_ref.actor.ppo_mini_batch_size=16", "trainer.logger=[]",
       "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
       "trainer.device=cpu", "trainer.seed=7",
       "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]


def loopback_bytes() -> int:
    """Bytes received on the loopback interface since boot (Linux)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[0])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def run_job(run_dir: Path, overrides: list, steps: int, env: dict) -> dict:
    """Run the job; loopback bytes at the first and the last step's log line."""
    cmd = [sys.executable, "-m", "siirl.main_dag", f"trainer.default_local_dir={run_dir}",
           f"trainer.total_training_steps={steps}", *JOB, *overrides]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env)
    metrics, marks = run_dir / "metrics.jsonl", {}
    while proc.poll() is None:
        logged = metrics.read_text().count("\n") if metrics.is_file() else 0
        for mark in (1, steps):
            if logged >= mark and mark not in marks:
                marks[mark] = loopback_bytes()
        time.sleep(0.05)
    err = proc.stderr.read()
    if proc.returncode != 0:
        raise SystemExit(f"the job failed ({proc.returncode}):\n{err[-3000:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {"records": records, "loopback": marks}


def summarize(result: dict, steps: int) -> dict:
    records = result["records"]

    def mean(pattern: str) -> float:
        values = [sum(v for k, v in r.items() if k.startswith("databuffer/")
                      and k.endswith(pattern)) for r in records]
        return sum(values) / len(values)

    marks = result["loopback"]
    return {
        "databuffer_bytes_sent": mean("/bytes_sent"),
        "databuffer_shared_bytes": mean("/shared_bytes"),
        "weight_sync_bytes": sum(r.get("weight_sync/bytes", 0.0) for r in records)
        / len(records),
        "loopback_bytes_per_step": (marks[steps] - marks[1]) / (steps - 1)
        if len(marks) == 2 else None,
        "step_s": sum(r["timing_s/step"] for r in records[1:]) / max(1, len(records) - 1),
        "pg_loss_last": records[-1].get("actor/pg_loss"),
    }


def two_node_cluster(root: Path):
    from ray.cluster_utils import Cluster

    (root / "ray").mkdir(parents=True, exist_ok=True)
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(root))
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    return cluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default="bench_cluster_traffic.json")
    ap.add_argument("overrides", nargs="*", help="key=value for both runs")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be at least 2 (bytes per step are taken between steps)")
    work = Path(tempfile.mkdtemp(prefix="ct", dir="/tmp"))  # short: Ray's socket paths
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS="")
    rows = {}
    try:
        one = run_job(work / "one", ["trainer.n_gpus_per_node=2", "trainer.ray_address=local",
                                     f"trainer.ray_temp_dir={work / 'r1'}", *args.overrides],
                      args.steps, env)
        rows["one node, 2 workers"] = summarize(one, args.steps)
        cluster = two_node_cluster(work / "cluster")
        try:
            two = run_job(work / "two", ["trainer.nnodes=2", "trainer.n_gpus_per_node=1",
                                         f"trainer.ray_address={cluster.address}",
                                         "trainer.ray_node_ip=127.0.0.1", *args.overrides],
                          args.steps, env)
        finally:
            cluster.shutdown()
        rows["two nodes, 1 worker each"] = summarize(two, args.steps)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nper training step (means over {args.steps} steps; loopback: steps 2..{args.steps})")
    print(f"{'run':28} {'DataBuffer sent':>16} {'shared memory':>14} {'weight sync':>12} "
          f"{'loopback':>12} {'step s':>7}")
    for name, r in rows.items():
        loop = r["loopback_bytes_per_step"]
        print(f"{name:28} {r['databuffer_bytes_sent'] / 1024:>13.1f} KB "
              f"{r['databuffer_shared_bytes'] / 1024:>11.1f} KB "
              f"{r['weight_sync_bytes'] / 2**20:>9.2f} MB "
              f"{(loop or 0) / 2**20:>9.2f} MB {r['step_s']:>7.2f}")
    write_result({"steps": args.steps, "overrides": args.overrides, "rows": rows}, args.out)


if __name__ == "__main__":
    main()
