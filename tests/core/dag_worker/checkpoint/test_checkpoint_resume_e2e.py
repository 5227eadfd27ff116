"""The main job end to end (CPU, CI size): a damaged newest checkpoint is skipped with a
warning, the run resumes from the previous one exactly, and metrics.jsonl has each step
once (issue 16, items 4 and 6). Each run is a real ``python -m siirl.main_dag``."""

import json
import subprocess
import sys
from pathlib import Path

SMALL = ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=16", "trainer.logger=[]",
         "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.device=cpu",
         "trainer.save_freq=2"]
IGNORED = ("timing_s/", "perf/")


def siirl_train(run_dir, *overrides):
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag",
                           f"trainer.default_local_dir={run_dir}", *SMALL, *overrides],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return proc


def training(run_dir):
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text()
               .splitlines()]
    return [r for r in records if "critic/score/mean" in r]


def comparable(record):
    return {k: v for k, v in record.items() if not k.startswith(IGNORED)}


def test_damaged_newest_checkpoint_resumes_from_the_previous_one_exactly(tmp_path):
    run = tmp_path / "run"
    siirl_train(run, "trainer.total_training_steps=4")  # checkpoints at steps 2 and 4
    straight = {r["step"]: comparable(r) for r in training(run)}
    assert sorted(p.name for p in run.glob("global_step_*")) == ["global_step_2",
                                                                   "global_step_4"]
    model = run / "global_step_4" / "actor" / "model.safetensors"
    data = bytearray(model.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 256] = bytes(b ^ 0xFF for b in data[middle:middle + 256])
    model.write_bytes(bytes(data))  # same size, a valid header: it would load as garbage

    proc = siirl_train(run, "trainer.total_training_steps=5")
    assert "warning:" in proc.stderr and "global_step_4" in proc.stderr
    assert "actor/model.safetensors is corrupted" in proc.stderr
    assert f"resumed from {run / 'global_step_2'} at step 2" in proc.stdout
    records = training(run)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]  # each step once
    for record in records[:4]:  # steps 3 and 4 replayed bitwise
        assert comparable(record) == straight[record["step"]], record["step"]
    assert (run / "global_step_4" / "COMMITTED").is_file()  # rewritten, intact
    assert not list(run.glob(".*.partial"))
