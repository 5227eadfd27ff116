"""Asynchronous training with the vllm rollout (the vllm-marked CI step): a vLLM server
per rollout worker generates with the weights the trainer syncs to it, its calls pausing
for a sync that arrives mid-call (partial rollouts); two rollout workers with in-process
engines do the same between calls."""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="needs vLLM (bash tools/setup.sh --vllm)")]
ROOT = Path(__file__).resolve().parents[2]


def run(run_dir, steps, *overrides):
    """The vllm preset asynchronously for ``steps`` steps, validated after the last; its
    training and validation records."""
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    cmd = [sys.executable, "-m", "siirl.main_dag", "--config",
           str(ROOT / "configs/grpo_vllm.yaml"),
           "async_training.enable=true", "async_training.staleness_threshold=1",
           "trainer.device=cpu", "trainer.ray_address=local", f"trainer.ray_temp_dir={ray_dir}",
           f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}",
           "trainer.logger=[]", "trainer.val_before_train=false", "data.train_batch_size=8",
           "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.n=4",
           f"trainer.default_local_dir={run_dir}", *overrides]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS="",
               VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in
               (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "critic/score/mean" in r]
    val = [r for r in records if "val/score/mean" in r]
    assert [r["step"] for r in train] == list(range(1, steps + 1))
    assert [r["step"] for r in val] == [steps]  # validated by vLLM, after a sync
    for record in train:
        assert record["weight_sync/bytes"] > 0 and record["async/policy_lag/max"] <= 1
        assert "actor/pg_loss" in record
    return train


def test_async_grpo_trains_ten_steps_with_a_vllm_server_rollout(tmp_path):
    train = run(tmp_path, 10, "actor_rollout_ref.rollout.mode=server",
                "async_training.partial_rollout=true")
    for record in train:
        assert 0 <= record["async/partial_ratio"] <= 1  # tokens record their versions


def test_two_rollout_workers_with_in_process_vllm_engines(tmp_path):
    # each rollout worker's engine is a world of its own: the trainer builds none of its
    # groups (vllm_engine.solo_world)
    run(tmp_path, 4, "actor_rollout_ref.rollout.mode=sync", "rollout.n_gpus_per_node=2")
