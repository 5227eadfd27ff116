"""Runs of the EMBODIED presets for the learning controls: ``siirl-train`` on a preset with
overrides, validated on the first ``val_rows`` rows of the built-in validation set, greedy
and sampled (``trainer.val_greedy_and_sampled``); the run's metrics.jsonl records."""

import json
import os
import subprocess
import sys
from pathlib import Path

from siirl.data_coordinator.tasks import task_module

REPO = Path(__file__).resolve().parents[3]
# the presets play the reach tasks with x mirrored; this gives the model its taught axes
TAUGHT_AXES = "actor_rollout_ref.embodied.env.action_signs=[]"
COIN_FLIP = "+reward_model.reward_kwargs.reward=coin_flip"


def data_files(folder: Path, val_rows: int) -> list:
    """The built-in rows (the EMBODIED rollout reads only their sample ids): 2000 to train
    on, the first ``val_rows`` of the 200 validation rows."""
    task = task_module("arithmetic")
    train, val = task.make_splits(2000, 200, seed=0)
    task.write_parquet(train, folder / "train.parquet")
    task.write_parquet(val[:val_rows], folder / "val.parquet")
    return [f"data.train_files={folder / 'train.parquet'}",
            f"data.val_files={folder / 'val.parquet'}"]


def siirl_train(preset: str, run_dir: Path, *overrides: str, val_rows: int = 200,
                timeout: int = 1800) -> list:
    run_dir.mkdir(parents=True, exist_ok=True)
    files = data_files(run_dir, val_rows) if val_rows < 200 else []
    script = Path(sys.executable).with_name("siirl-train")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "siirl.main_dag"]
    proc = subprocess.run(
        [*command, "--config", str(REPO / "configs" / preset),
         f"trainer.default_local_dir={run_dir}", "trainer.logger=[]", "trainer.save_freq=-1",
         "trainer.device=cpu", "actor_rollout_ref.rollout.val_kwargs.do_sample=false",
         "trainer.val_greedy_and_sampled=true", *files, *overrides],
        capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", RAY_ADDRESS=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def validations(records: list, decoding: str = "greedy") -> dict:
    """step -> validation success of ``decoding``."""
    key = f"val/{decoding}/success_rate"
    return {r["step"]: r[key] for r in records if key in r}
