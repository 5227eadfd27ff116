"""A step whose update is dropped for a non-finite gradient is counted and explained.

A learning rate of 1e12 blows the weights up in step 1; from step 2 the loss and the
gradient are NaN, and the PPO updater drops those updates."""

import json
import subprocess
import sys


def test_dropped_updates_are_counted_and_explained_once(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "siirl.main_dag", f"trainer.default_local_dir={tmp_path}",
         "data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=16", "trainer.logger=[]",
         "trainer.val_before_train=false", "trainer.device=cpu", "trainer.test_freq=-1",
         "trainer.save_freq=-1", "trainer.total_training_steps=3",
         "actor_rollout_ref.actor.optim.lr=1e12"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    skipped = [s["train/skipped_steps"] for s in steps]
    assert skipped[0] == 0 and skipped[1] == skipped[2] == 1.0, skipped
    assert proc.stderr.count("optimizer update(s) skipped") == 1  # explained once
    assert "step 2: 1 optimizer update(s) skipped (actor: 1)" in proc.stderr
    assert "actor/pg_loss=nan" in proc.stderr
    assert "2 optimizer update(s) were skipped in this run" in proc.stderr
