"""Summarise a finished run from its metrics.jsonl: the numbers the README quotes.

    .venv/bin/python tools/bench/run_summary.py runs/main [--wall-s SECONDS] [--json OUT]

Prints a table (steps, median and 10th-90th percentile step time, the summed time of steps
and validations, validation score first / best (step) / last) and writes it as JSON
(default ``RUN_DIR/summary.json``). ``--wall-s`` records the command's own wall time as
measured around it (start-up included), which metrics.jsonl cannot know.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path


def summarise(run_dir: Path) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "timing_s/step" in r]
    vals = [r for r in records if "val/score/mean" in r]
    times = sorted(r["timing_s/step"] for r in steps)
    deciles = statistics.quantiles(times, n=10) if len(times) > 1 else times * 9
    best = max(vals, key=lambda r: r["val/score/mean"]) if vals else None
    return {
        "run_dir": str(run_dir), "machine": f"{platform.machine()}, {_cpus()} CPU cores",
        "steps": len(steps), "step_s_median": statistics.median(times) if times else None,
        "step_s_p10": deciles[0], "step_s_p90": deciles[-1],
        "steps_total_s": sum(times),
        "validation_total_s": sum(r.get("timing_s/validation", 0.0) for r in vals),
        "val_first": vals[0]["val/score/mean"] if vals else None,
        "val_best": best["val/score/mean"] if best else None,
        "val_best_step": best["step"] if best else None,
        "val_last": vals[-1]["val/score/mean"] if vals else None,
    }


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--wall-s", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    summary = summarise(args.run_dir)
    if args.wall_s is not None:
        summary["wall_s"] = args.wall_s
    for key, value in summary.items():
        shown = f"{value:.4g}" if isinstance(value, float) else value
        print(f"{key:<20} {shown}")
    out = args.json or args.run_dir / "summary.json"
    out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
