"""Per-step throughput of the main job: rollout and training tokens/s, time split by node.

    python tools/bench/step_throughput.py [--steps 6] [--out bench_step_throughput.json] \
        [key=value ...]

Runs the real training loop (same code as siirl-train) for a few steps in a temporary run
directory, skips the first step (warm-up), and prints a table plus JSON with the mean of
each figure over the remaining steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from bench_info import write_result  # tools/bench is on sys.path when run as a script


def run(steps: int, overrides: list) -> list:
    from siirl.dag_worker.dagworker import DAGWorker
    from siirl.dag_worker.walk.trainer_loop import Trainer
    from siirl.execution.dag.task_loader import load_pipeline
    from siirl.params.parser import parse_config

    with tempfile.TemporaryDirectory() as run_dir:
        config = parse_config([f"trainer.default_local_dir={run_dir}",
                               f"trainer.total_training_steps={steps}", "trainer.test_freq=-1",
                               "trainer.val_before_train=false", "trainer.save_freq=-1",
                               "trainer.logger=[]", *overrides])
        worker = DAGWorker(load_pipeline(config), config)
        return [m for m in Trainer(worker).fit() if "timing_s/step" in m]


def summarise(history: list) -> dict:
    measured = history[1:] if len(history) > 1 else history
    mean = lambda key: statistics.fmean(m.get(key, 0.0) for m in measured)  # noqa: E731
    node_keys = sorted({k for m in measured for k in m
                        if k.startswith("timing_s/") and k != "timing_s/step"})
    step_time = mean("timing_s/step")
    rollout_time = mean("timing_s/rollout_actor")
    train_time = mean("timing_s/actor_train")
    return {
        "steps_measured": len(measured),
        "step_time_s": step_time,
        "rollout_tokens_per_s": mean("rollout/tokens") / rollout_time if rollout_time else 0.0,
        "train_tokens_per_s": mean("perf/total_num_tokens") / train_time if train_time else 0.0,
        "end_to_end_tokens_per_s": mean("perf/throughput"),
        "time_split": {k.split("/", 1)[1]: {"seconds": mean(k),
                                            "share": mean(k) / step_time if step_time else 0.0}
                       for k in node_keys},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default="bench_step_throughput.json")
    args, overrides = parser.parse_known_args(argv)
    start = time.perf_counter()
    result = summarise(run(args.steps, overrides))
    result.update({"overrides": overrides, "wall_s": time.perf_counter() - start})
    print(f"{'figure':<28}{'value':>14}")
    for key in ("step_time_s", "rollout_tokens_per_s", "train_tokens_per_s",
                "end_to_end_tokens_per_s"):
        print(f"{key:<28}{result[key]:>14.2f}")
    print(f"\n{'node':<28}{'seconds':>10}{'share':>8}")
    for node, split in result["time_split"].items():
        print(f"{node:<28}{split['seconds']:>10.3f}{split['share']:>8.1%}")
    write_result(result, args.out, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
