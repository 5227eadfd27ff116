"""Through the command line: a reward function calling ``sys.exit(0)`` no longer ends the
run with status 0. Once, it costs one sample; always, the run stops with a clear error
after ``reward_model.max_failed_steps`` steps."""

import json
import subprocess
import sys

REWARD = """
import os, sys

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if {always} or not os.path.exists(__file__ + ".done"):
        open(__file__ + ".done", "w").close()
        sys.exit(0)
    return float(solution_str.strip().startswith(str(ground_truth)))
"""
BASE = ("data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16", "trainer.logger=[]",
        "trainer.val_before_train=false", "trainer.device=cpu", "trainer.test_freq=-1",
        "trainer.save_freq=-1")


def run(tmp_path, always: bool, *overrides):
    path = tmp_path / "reward.py"
    path.write_text(REWARD.format(always=always))
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag", *BASE,
                           f"trainer.default_local_dir={tmp_path / 'run'}",
                           f"custom_reward_function.path={path}", *overrides],
                          capture_output=True, text=True, timeout=300)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    return proc, [json.loads(line) for line in lines], str(path)


def test_one_sys_exit_costs_one_sample(tmp_path):
    proc, steps, _ = run(tmp_path, False, "trainer.total_training_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [s["step"] for s in steps] == [1, 2]
    assert steps[0]["reward/errors/exit"] == 1.0 and steps[0]["reward/errors"] == 1.0
    assert steps[1]["reward/errors"] == 0.0
    assert "sys.exit(0)" in proc.stderr and "Traceback" not in proc.stderr


def test_sys_exit_on_every_sample_stops_the_run_with_a_message(tmp_path):
    proc, steps, path = run(tmp_path, True, "trainer.total_training_steps=3",
                            "reward_model.max_failed_steps=2")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert [s["step"] for s in steps] == [1, 2]  # stopped after the second failed step
    assert all(s["reward/errors/exit"] == s["reward/samples"] == 64 for s in steps)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("siirl-train: error: the reward function 'compute_score' in " + path)
    assert "max_failed_steps=2" in last and "sys.exit(0)" in last
    assert "Traceback" not in proc.stderr
