"""Embodied GRPO on robosuite's Lift with the built-in tiny VLA: 2 steps on a CPU.

Skips where robosuite or the renderer is missing (``nox -s embodied_sim`` runs it with
both); the tiny VLA was made for the 2D reach task, so it does not lift the cube: the test
checks that the workflow runs end to end on a real simulator with a 128x128 camera and
7-D actions, not that it learns."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from test_robosuite_adapter import _why_skip

pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=str(_why_skip()))

CONFIG = """
algorithm:
  workflow_type: EMBODIED
  adv_estimator: grpo
actor_rollout_ref:
  model: {path: "builtin:tiny-vla"}
  embodied:
    action_chunks_len: 4
    action_token_len: 7
    env:
      env_type: robosuite
      env_name: Lift
      env_config: {image_size: 128}
      max_steps: 8
      num_envs: 2
  rollout: {n: 2, temperature: 1.0}
  actor: {ppo_mini_batch_size: 1, ppo_micro_batch_size_per_gpu: 2}
reward_model: {reward_manager: embodied}
data: {train_batch_size: 1}
trainer:
  total_training_steps: 2
  val_before_train: false
  test_freq: -1
  save_freq: -1
"""


def test_two_grpo_steps_on_lift(tmp_path):
    config = tmp_path / "lift.yaml"
    config.write_text(textwrap.dedent(CONFIG))
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "osmesa"),
           "PYOPENGL_PLATFORM": os.environ.get("PYOPENGL_PLATFORM", "osmesa")}
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag", "--config", str(config),
                           f"trainer.default_local_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    trained = [m for m in steps if "actor/pg_loss" in m]
    assert [m["step"] for m in trained] == [1, 2]
    for metrics in trained:
        assert metrics["env/episodes"] == 2.0
        assert 1.0 <= metrics["env/chunks/mean"] <= 2.0  # 8 actions in chunks of 4
        assert metrics["env/lost"] == 0.0
