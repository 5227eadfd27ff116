"""The AGENTIC FrozenLake preset with the vllm rollout (the vllm-marked CI step): episodes
are played by vLLM with the trainer's weights, validation included."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="needs vLLM (bash tools/setup.sh --vllm)")]
ROOT = Path(__file__).resolve().parents[2]


def test_frozenlake_preset_plays_and_trains_with_vllm(tmp_path):
    cmd = [sys.executable, "-m", "siirl.main_dag", "--config",
           str(ROOT / "configs/agentic_frozenlake.yaml"), "actor_rollout_ref.rollout.name=vllm",
           "trainer.total_training_steps=3", "trainer.test_freq=3", "trainer.save_freq=-1",
           "trainer.val_before_train=false", f"trainer.default_local_dir={tmp_path}",
           "trainer.logger=[]"]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in
               (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "val/score/mean" not in r]
    val = [r for r in records if "val/score/mean" in r]
    assert [r["step"] for r in train] == [1, 2, 3] and [r["step"] for r in val] == [3]
    for record in train:
        assert record["weight_sync/bytes"] > 0  # vLLM plays with the trainer's weights
        assert record["env/turns/mean"] >= 1 and "actor/pg_loss" in record
        assert not any(v for k, v in record.items() if k.startswith("env/errors/"))
    assert 0.0 <= val[0]["val/success_rate"] <= 1.0
