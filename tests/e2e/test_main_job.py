"""The main job end to end on CPU: GRPO on the built-in task with the built-in model.

CI-sized: small batches and few steps. Each run is a real ``python -m siirl.main_dag``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
# Small but real: 16 prompts x 4 samples per step.
SMALL = ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=16", "trainer.logger=[]"]


def siirl_train(run_dir, *overrides, timeout=600):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag",
                           f"trainer.default_local_dir={run_dir}", *overrides],
                          capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def records(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text()
            .splitlines()]


def training(run_dir):
    return {r["step"]: r for r in records(run_dir) if "critic/score/mean" in r}


def validation(run_dir):
    return [r for r in records(run_dir) if "val/score/mean" in r]


def test_grpo_raises_reward(tmp_path):
    siirl_train(tmp_path, *SMALL, "trainer.total_training_steps=24", "trainer.test_freq=12",
                "data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32")
    steps = training(tmp_path)
    assert sorted(steps) == list(range(1, 25))
    first = sum(steps[s]["critic/score/mean"] for s in range(1, 7)) / 6
    last = sum(steps[s]["critic/score/mean"] for s in range(19, 25)) / 6
    assert last > first + 0.05, (first, last)
    vals = validation(tmp_path)
    assert [v["step"] for v in vals] == [0, 12, 24]
    assert vals[-1]["val/score/mean"] > vals[0]["val/score/mean"]
    for key in ("critic/score/mean", "critic/advantages/mean", "actor/pg_loss", "actor/kl_loss",
                "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac",
                "response_length/mean", "timing_s/rollout_actor", "timing_s/actor_train",
                "perf/throughput"):
        assert key in steps[24], key
    # the actor -> rollout weight sync is a timed step of its own after every update
    assert all("timing_s/weight_sync" in steps[s] for s in steps)
    # on-policy (one epoch, one mini-batch): the planner leaves the old-log-prob node out
    assert not any("timing_s/actor_old_log_prob" in steps[s] for s in steps)
    assert "val/arithmetic/score/mean" in vals[-1]


IGNORED = ("timing_s/", "perf/")


def _comparable(record):
    return {k: v for k, v in record.items() if not k.startswith(IGNORED)}


def test_resume_is_exact(tmp_path):
    common = [*SMALL, "trainer.save_freq=2", "trainer.test_freq=-1",
              "trainer.val_before_train=false", "actor_rollout_ref.actor.use_kl_loss=true"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    siirl_train(straight, *common, "trainer.total_training_steps=4")
    siirl_train(resumed, *common, "trainer.total_training_steps=2")
    assert (resumed / "global_step_2" / "COMMITTED").is_file()
    proc = siirl_train(resumed, *common, "trainer.total_training_steps=4")
    assert "resumed from" in proc.stdout
    a, b = training(straight), training(resumed)
    assert sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        assert _comparable(a[step]) == _comparable(b[step]), step
    # The Hugging Face export loads with plain transformers.
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(resumed / "global_step_4" / "actor" /
                                                 "huggingface")
    assert model.num_parameters() > 0


def test_raising_and_hanging_reward_functions_leave_the_run_going(tmp_path):
    proc = siirl_train(tmp_path, *SMALL, "trainer.total_training_steps=1", "trainer.test_freq=-1",
                       "trainer.val_before_train=false",
                       "reward_model.reward_manager=parallel",
                       f"custom_reward_function.path={HERE / 'siirl_e2e_rewards.py'}",
                       "custom_reward_function.name=flaky_score",
                       "+custom_reward_function.reward_kwargs.timeout_s=1.0", timeout=300)
    step = training(tmp_path)[1]
    assert step["reward/errors/exception"] > 0 and step["reward/errors/timeout"] > 0
    assert "user reward bug" in proc.stderr or "reward" in proc.stderr


def test_bad_dataset_row_names_file_and_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    bad = tmp_path / "bad.parquet"
    table = pa.table({"data_source": ["arithmetic", "arithmetic"],
                      "prompt": [[{"role": "user", "content": "1+1="}],
                                 [{"role": "user", "content": "2+2="}]],
                      "ability": ["math", None],
                      "reward_model": [{"style": "rule", "ground_truth": "2"},
                                       {"style": "rule", "ground_truth": "4"}]})
    pq.write_table(table, bad)
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag",
                           f"trainer.default_local_dir={tmp_path / 'run'}",
                           f"data.train_files={bad}", f"data.val_files={bad}", *SMALL],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0
    assert str(bad) in proc.stderr and "row 1" in proc.stderr and "Traceback" not in proc.stderr
