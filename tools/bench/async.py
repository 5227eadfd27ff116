"""Asynchronous against synchronous training on the same 2 CPU workers.

    python tools/bench/async.py [--rounds 3] [--config configs/grpo_async.yaml] \
        [--out bench_async.json] [key=value ...]

Each round runs the preset twice, in alternating order: asynchronously as written (one
rollout worker, one trainer worker) and with ``async_training.enable=false`` on 2 workers
(``trainer.n_gpus_per_node=2``: both generate, then both train, data-parallel). It reads
each run's ``metrics.jsonl`` and reports

* steps per second: ``(last - first) / (wall(last) - wall(first))`` from ``timing_s/wall``
  (the trainer's wall clock, validations included), and the ratio async / sync;
* validation at each validated step of both runs, the mean, last and largest gap at
  equal steps, and each run's gain over step 0 (at the last validated step);
* async only: the share of its wall time the trainer waited for samples
  (``timing_s/wait_rollout`` / ``timing_s/step``) and the largest policy lag logged.

The table's last row is the median over rounds; JSON keeps every run's curve (step, wall
clock, validation) so the docs can draw validation against wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when loaded by path
from bench_info import write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SYNC = ["async_training.enable=false", "trainer.n_gpus_per_node=2"]


def run(config: str, extra: list, folder: Path) -> dict:
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths
    cmd = [sys.executable, "-m", "siirl.main_dag", "--config", config,
           f"trainer.default_local_dir={folder}", "trainer.ray_address=local",
           f"trainer.ray_temp_dir={ray_dir}", "trainer.logger=[]",
           "trainer.resume_mode=disable", *extra]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS="")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"run failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return summarize(folder, time.perf_counter() - start)


def summarize(folder: Path, command_s: float) -> dict:
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in records if "timing_s/step" in r}
    val = {r["step"]: r["val/score/mean"] for r in records if "val/score/mean" in r}
    steps = sorted(train)
    first, last = steps[0], steps[-1]
    wall = {s: train[s]["timing_s/wall"] for s in steps}
    out = {"steps": len(steps), "command_s": command_s,
           "steps_per_s": (last - first) / (wall[last] - wall[first]),
           "val": {str(s): v for s, v in sorted(val.items())},
           "curve": [[s, wall[s]] for s in steps]}
    if "async/policy_lag/max" in train[last]:
        busy = sum(train[s]["timing_s/step"] for s in steps[1:])
        out["wait_share"] = sum(train[s]["timing_s/wait_rollout"] for s in steps[1:]) / busy
        out["lag_max"] = max(train[s]["async/policy_lag/max"] for s in steps)
    return out


def compare(a: dict, s: dict) -> dict:
    shared = sorted(set(a["val"]) & set(s["val"]), key=int)
    gaps = [abs(a["val"][k] - s["val"][k]) for k in shared if k != "0"]
    return {"ratio": a["steps_per_s"] / s["steps_per_s"], "val_gap_max": max(gaps, default=0.0),
            "val_gap_mean": sum(gaps) / len(gaps) if gaps else 0.0,
            "val_gap_last": gaps[-1] if gaps else 0.0,
            "async_gain": a["val"][shared[-1]] - a["val"]["0"] if shared else None,
            "sync_gain": s["val"][shared[-1]] - s["val"]["0"] if shared else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--config", default=str(ROOT / "configs/grpo_async.yaml"))
    parser.add_argument("--out", default="bench_async.json")
    parser.add_argument("overrides", nargs="*", help="key=value for both runs")
    args = parser.parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory() as scratch:
        for number in range(args.rounds):
            order = ["async", "sync"] if number % 2 == 0 else ["sync", "async"]
            runs = {}
            for kind in order:
                extra = args.overrides + (SYNC if kind == "sync" else [])
                runs[kind] = run(args.config, extra, Path(scratch) / f"{kind}{number}")
            rounds.append({**runs, **compare(runs["async"], runs["sync"])})
            row = rounds[-1]
            print(f"round {number + 1}: async {row['async']['steps_per_s']:.2f} steps/s, "
                  f"sync {row['sync']['steps_per_s']:.2f}, ratio {row['ratio']:.2f}, "
                  f"trainer waited {row['async']['wait_share']:.1%}, lag max "
                  f"{row['async']['lag_max']:g}, val gap mean {row['val_gap_mean']:.3f} last "
                  f"{row['val_gap_last']:.3f} max {row['val_gap_max']:.3f}", flush=True)

    def median(get):
        return statistics.median(get(r) for r in rounds)

    summary = {"ratio": median(lambda r: r["ratio"]),
               "async_steps_per_s": median(lambda r: r["async"]["steps_per_s"]),
               "sync_steps_per_s": median(lambda r: r["sync"]["steps_per_s"]),
               "wait_share": median(lambda r: r["async"]["wait_share"]),
               "val_gap_max": median(lambda r: r["val_gap_max"]),
               "val_gap_mean": median(lambda r: r["val_gap_mean"]),
               "val_gap_last": median(lambda r: r["val_gap_last"]),
               "async_gain": median(lambda r: r["async_gain"]),
               "sync_gain": median(lambda r: r["sync_gain"]),
               "lag_max": max(r["async"]["lag_max"] for r in rounds)}
    print(f"\n{'':<8}{'async steps/s':>14}{'sync steps/s':>14}{'ratio':>7}{'wait':>7}"
          f"{'gap mean':>9}{'gap last':>9}{'async gain':>12}{'sync gain':>11}")
    for i, r in enumerate(rounds):
        print(f"{'round ' + str(i + 1):<8}{r['async']['steps_per_s']:>14.2f}"
              f"{r['sync']['steps_per_s']:>14.2f}{r['ratio']:>7.2f}"
              f"{r['async']['wait_share']:>7.1%}{r['val_gap_mean']:>9.3f}"
              f"{r['val_gap_last']:>9.3f}"
              f"{r['async_gain']:>12.3f}{r['sync_gain']:>11.3f}")
    m = summary
    print(f"{'median':<8}{m['async_steps_per_s']:>14.2f}{m['sync_steps_per_s']:>14.2f}"
          f"{m['ratio']:>7.2f}{m['wait_share']:>7.1%}{m['val_gap_mean']:>9.3f}"
          f"{m['val_gap_last']:>9.3f}"
          f"{m['async_gain']:>12.3f}{m['sync_gain']:>11.3f}")
    write_result({"config": os.path.relpath(args.config, ROOT), "overrides": args.overrides,
                  "summary": summary, "rounds": rounds}, args.out, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
