"""Record the metrics of short runs of the built-in jobs, or compare two recordings.

A refactor that must not change behaviour is checked with it: record before, record after
(same machine, same ``trainer.cpu_threads``), compare; every value must be bitwise equal.
Wall-clock metrics (``timing_s/*``, throughputs) are left out, and so are keys that only
one side has (a new metric is not a changed one); the number of records must agree.

    python tools/parity/metrics_parity.py record before.json
    python tools/parity/metrics_parity.py record after.json
    python tools/parity/metrics_parity.py compare before.json after.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

COMMON = ["trainer.logger=[]", "trainer.total_training_steps=12", "trainer.test_freq=6",
          "trainer.save_freq=-1", "trainer.cpu_threads=1"]
# The main job (GRPO), GRPO with the KL loss / shuffled epochs / micro-batches, PPO with a
# critic and GAE, KL in the reward (adaptive controller), and DAPO as the e2e tests run it.
JOBS = {
    "grpo_main_job": [],
    "grpo_kl_loss_micro": ["actor_rollout_ref.actor.use_kl_loss=true",
                           "actor_rollout_ref.actor.ppo_epochs=2",
                           "actor_rollout_ref.actor.shuffle=true",
                           "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
                           "actor_rollout_ref.actor.entropy_coeff=0.01"],
    "ppo_gae_critic": ["algorithm.adv_estimator=gae", "trainer.critic_warmup=2",
                       "critic.ppo_micro_batch_size_per_gpu=64"],
    "ppo_kl_in_reward": ["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true",
                         "algorithm.kl_ctrl.type=adaptive"],
    "dapo": ["algorithm.workflow_type=DAPO", "algorithm.filter_groups.enable=true",
             "algorithm.filter_groups.metric=acc",
             "algorithm.filter_groups.max_num_gen_batches=8",
             "actor_rollout_ref.actor.clip_ratio_high=0.28", "reward_model.reward_manager=dapo",
             "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=2",
             "reward_model.overlong_buffer.penalty_factor=0.5"],
}
# Presets run from their configs/ file, first 10 steps: (file, overrides).
PRESETS = {
    "agentic_frozenlake": ("agentic_frozenlake.yaml", ["trainer.total_training_steps=10"]),
    "embodied_grpo": ("embodied_grpo.yaml", ["trainer.total_training_steps=10"]),
}
ROOT = Path(__file__).resolve().parents[2]


def wall_clock(key: str) -> bool:
    return key.startswith("timing_s/") or (key.startswith("perf/")
                                           and key != "perf/total_num_tokens")


def job_args(name: str) -> list:
    """The command line of a recorded job after ``python -m siirl.main_dag``."""
    if name in PRESETS:
        preset, overrides = PRESETS[name]
        return ["--config", str(ROOT / "configs" / preset), *COMMON, *overrides]
    return [*COMMON, *JOBS[name]]


def run_job(name: str, python: str) -> list:
    with tempfile.TemporaryDirectory() as run_dir:
        proc = subprocess.run([python, "-m", "siirl.main_dag",
                               f"trainer.default_local_dir={run_dir}", *job_args(name)],
                              capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            sys.exit(f"job {name} failed:\n{proc.stderr[-3000:]}")
        records = [json.loads(line) for line in
                   (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not wall_clock(k)} for r in records]


def compare(before: dict, after: dict) -> list:
    problems = []
    for job in sorted(set(before) & set(after)):  # a recording of some jobs (--jobs) is fine
        a, b = before[job], after[job]
        if len(a) != len(b):
            problems.append(f"{job}: {len(a)} records before, {len(b)} after")
        for index, (ra, rb) in enumerate(zip(a, b, strict=False)):
            for key in sorted(set(ra) & set(rb)):
                if json.dumps(ra[key]) != json.dumps(rb[key]):
                    problems.append(f"{job} record {index} (step {ra.get('step')}): {key} "
                                    f"{ra[key]!r} -> {rb[key]!r}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out")
    rec.add_argument("--jobs", nargs="*", default=[*sorted(JOBS), *PRESETS])
    rec.add_argument("--python", default=sys.executable)
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("before")
    cmp_.add_argument("after")
    args = parser.parse_args()
    if args.command == "record":
        result = {}
        for name in args.jobs:
            result[name] = run_job(name, args.python)
            print(f"{name}: {len(result[name])} records", flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        return
    before = json.loads(Path(args.before).read_text())
    after = json.loads(Path(args.after).read_text())
    problems = compare(before, after)
    for job in sorted(set(before) - set(after)):
        print(f"{job:24s} not in the second recording")
    for job in sorted(set(before) & set(after)):
        keys = sum(len(r) for r in before[job])
        differs = any(p.split(" ", 1)[0].rstrip(":") == job for p in problems)
        print(f"{job:24s} {len(before[job]):3d} records {keys:5d} values "
              f"{'DIFFER' if differs else 'equal'}")
    for line in problems[:40]:
        print("  " + line)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
