"""The main job's console carries no library deprecation notice (transformers' KV-cache
rename among them): siiRL speaks each library's current names, and what a library still
says goes to ``warnings.log``. A real ``python -m siirl.main_dag``, CI-sized."""

import subprocess
import sys

TINY = ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16", "trainer.logger=[console]",
        "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.device=cpu",
        "data.val_batch_size=16", "trainer.save_freq=-1"]


def test_no_library_deprecation_reaches_the_console(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag",
                           f"trainer.default_local_dir={tmp_path}", *TINY],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 2:" in proc.stdout  # it trained and validated
    console = proc.stdout + proc.stderr
    assert "deprecat" not in console.lower(), console[-3000:]
