"""The EMBODIED presets end to end (CPU, builtin:tiny-vla on the built-in reach task):
episodes are played, trained on, validated with GIFs, and a run resumed from step 1 repeats
step 2 bitwise; SRPO rows carry video embeddings and pay failures a progress reward."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALL = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=2",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
         "actor_rollout_ref.embodied.env.max_steps=24",
         "trainer.logger=[]", "trainer.test_freq=2", "trainer.total_training_steps=2",
         "trainer.save_freq=1", "trainer.device=cpu",
         "trainer.val_greedy_and_sampled=false",  # one validation pass (CI time)
         # the resume check runs 1 step, then the same command to 2: the preset's cosine
         # decay spans the run's steps, so it would differ between the two totals
         "actor_rollout_ref.actor.optim.lr_scheduler_type=constant"]
IGNORED = ("timing_s/", "perf/")


def siirl_train(preset, run_dir, *overrides, console=None):
    """The run's metrics.jsonl records; its console lines appended to ``console``."""
    script = Path(sys.executable).with_name("siirl-train")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "siirl.main_dag"]
    proc = subprocess.run([*command, "--config", str(REPO / "configs" / preset),
                           f"trainer.default_local_dir={run_dir}", *SMALL, *overrides],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1",
                                   RAY_AUTH_MODE="disabled", RAY_ADDRESS=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    if console is not None:
        console += [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text()
            .splitlines()]


def _train_steps(records):
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(IGNORED)}
            for r in records if "env/success_rate" in r}


def test_embodied_grpo_trains_validates_and_resumes_exactly(tmp_path):
    straight = tmp_path / "straight"
    console = []
    records = siirl_train("embodied_grpo.yaml", straight, "trainer.logger=[console]",
                          console=console)
    # the console leads with the episodes' success rate and reward, validation's too
    assert [line.split("  ")[0].split("=")[0] for line in console] == [
        "step 0: val/success_rate", "step 1: env/success_rate", "step 2: env/success_rate",
        "step 2: val/success_rate"], console
    assert all("env/reward/mean=" in line for line in console[1:3])
    steps = _train_steps(records)
    assert sorted(steps) == [1, 2]
    for record in steps.values():
        assert record["env/episodes"] == 8.0  # 2 groups x 4 episodes
        assert 1.0 <= record["env/chunks/mean"] <= 6.0  # 24 actions in chunks of 4
        assert "actor/pg_loss" in record and "embodied_sampling/kept" in record
    validations = [r for r in records if "val/success_rate" in r]
    assert [r["step"] for r in validations] == [0, 2]
    assert 0.0 <= validations[0]["val/success_rate"] <= 1.0
    videos = sorted((straight / "val_videos" / "step_0").glob("*.gif"))
    assert videos, "validation writes each task's first episode as a GIF"

    resumed = tmp_path / "resumed"
    siirl_train("embodied_grpo.yaml", resumed, "trainer.total_training_steps=1")
    again = _train_steps(siirl_train("embodied_grpo.yaml", resumed))
    assert again[2] == steps[2]


def test_embodied_srpo_rows_carry_video_embeddings(tmp_path):
    records = siirl_train("embodied_srpo.yaml", tmp_path / "srpo",
                          "trainer.total_training_steps=1", "trainer.val_before_train=false")
    step = _train_steps(records)[1]
    assert "reward/success_rate" in step
    # a group with both outcomes pays its failures a progress reward below a success's
    if "reward/progress/mean" in step:
        assert 0.0 <= step["reward/progress/mean"] < 1.0


def test_two_workers_log_the_first_step_of_one(tmp_path):
    """The same global batch on 2 workers (each plays one group's episodes) logs the first
    step's metrics of 1 worker: counts add up, rates and losses agree, and a worker whose
    only group is filtered out adds no empty mean."""
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths
    common = ["trainer.total_training_steps=1", "trainer.save_freq=-1",
              "trainer.val_before_train=false",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"]
    one = _train_steps(siirl_train("embodied_grpo.yaml", tmp_path / "one", *common))[1]
    two = _train_steps(siirl_train(
        "embodied_grpo.yaml", tmp_path / "two", *common, "trainer.n_gpus_per_node=2",
        "trainer.ray_address=local", f"trainer.ray_temp_dir={ray_dir}"))[1]
    assert two["env/episodes"] == one["env/episodes"] == 8.0
    assert set(two) == set(one)
    for key, value in one.items():
        if isinstance(value, float):
            assert abs(two[key] - value) <= 1e-5 * max(1.0, abs(value)), key
