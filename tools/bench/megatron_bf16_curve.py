"""The main job under ``strategy=megatron`` in fp32 and in bf16 (actor and reference
``megatron.dtype=bfloat16``: bf16 weights and compute, fp32 main weights in megatron's
distributed optimizer), step by step: the largest difference of the loss curve, and of the
reward, entropy and grad-norm curves beside it.

    python tools/bench/megatron_bf16_curve.py [--steps 50] [--out bench_megatron_bf16.json] \
        [--target 0.02] [key=value ...]

Each run is a ``python -m siirl.main_dag`` of its own (megatron's parallel state is one
per process) in a temporary directory; extra ``key=value`` overrides go to both. Prints a
table (every tenth step and the largest differences) and writes JSON with both curves.
The two runs sample their own rollouts (the rollout generates with the weights each run
trained), so their curves drift apart as runs from two seeds would; the loss curve's
largest difference is the figure that should stay within 0.02.
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

from bench_info import write_result  # tools/bench is on sys.path when run as a script

LOSS = "actor/pg_loss"
CURVES = (LOSS, "critic/score/mean", "actor/entropy", "actor/grad_norm")
BF16 = ("actor_rollout_ref.actor.megatron.dtype=bfloat16",
        "actor_rollout_ref.ref.megatron.dtype=bfloat16")


def run(steps: int, overrides: list, run_dir: str) -> dict:
    """``{step: metrics}`` of one training run."""
    command = [sys.executable, "-m", "siirl.main_dag", f"trainer.default_local_dir={run_dir}",
               f"trainer.total_training_steps={steps}", "trainer.save_freq=-1",
               "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.logger=[]",
               "actor_rollout_ref.actor.strategy=megatron", *overrides]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    rows = map(json.loads, (Path(run_dir) / "metrics.jsonl").read_text().splitlines())
    return {row["step"]: row for row in rows if LOSS in row}


def compare(fp32: dict, bf16: dict) -> dict:
    steps = sorted(set(fp32) & set(bf16))
    result = {"steps": len(steps), "max_abs_diff": {}, "at_step": {}, "curves": {}}
    for key in CURVES:
        diffs = {s: abs(bf16[s][key] - fp32[s][key]) for s in steps if key in fp32[s]}
        worst = max(diffs, key=diffs.get)
        result["max_abs_diff"][key], result["at_step"][key] = diffs[worst], worst
        result["curves"][key] = {"fp32": [fp32[s][key] for s in steps],
                                 "bf16": [bf16[s][key] for s in steps]}
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--out", default="bench_megatron_bf16.json")
    parser.add_argument("--target", type=float, default=0.02,
                        help="largest loss-curve difference allowed (default 0.02)")
    args, overrides = parser.parse_known_args(argv)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = run(args.steps, overrides, os.path.join(tmp, "fp32"))
        fp32_s = time.perf_counter() - start
        bf16 = run(args.steps, [*overrides, *BF16], os.path.join(tmp, "bf16"))
    result = compare(fp32, bf16)
    result.update(overrides=overrides, target=args.target, fp32_wall_s=fp32_s,
                  bf16_wall_s=time.perf_counter() - start - fp32_s,
                  within_target=result["max_abs_diff"][LOSS] <= args.target)
    header = "".join(f"{key.split('/', 1)[1] + ' fp32/bf16':>28}" for key in CURVES)
    print(f"{'step':>5}{header}")
    for i in range(0, result["steps"], 10):
        cells = "".join(f"{result['curves'][k]['fp32'][i]:>14.4f}"
                        f"{result['curves'][k]['bf16'][i]:>14.4f}" for k in CURVES)
        print(f"{i + 1:>5}{cells}")
    print(f"\n{'curve':<22}{'max |bf16 - fp32|':>20}{'at step':>9}")
    for key in CURVES:
        print(f"{key:<22}{result['max_abs_diff'][key]:>20.5f}{result['at_step'][key]:>9}")
    verdict = "within" if result["within_target"] else "NOT within"
    print(f"\nloss curve {verdict} {args.target} over {result['steps']} steps "
          f"(fp32 {fp32_s:.0f} s, bf16 {result['bf16_wall_s']:.0f} s)")
    write_result(result, args.out, argv)
    return 0 if result["within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
