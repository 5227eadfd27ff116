"""siiRL's two MARFT workflow files, unchanged, train both agents on the built-in two-role
game: a Reasoner and an Actor take turns on the built-in arithmetic problems and the math
(or code) environment checks the Actor's answer. The files ask for rollout tensor parallel
size 4, so the runs use 4 CPU workers. The code workflow's run (the same pipeline, another
environment) is left to ``SIIRL_LAUNCH_SCRIPTS=all`` (``nox -s launch_scripts``)."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARFT = ROOT / "examples/experimental/marft/config"
COMMON = ["algorithm.adv_estimator=gae_marft", "trainer.n_gpus_per_node=4",
          "trainer.ray_address=local", "trainer.device=cpu", "trainer.logger=[]",
          "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
          "critic.ppo_mini_batch_size=8",
          "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2", "trainer.seed=3"]


def _run(run_dir, workflow, *overrides, timeout=400):
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    cmd = [sys.executable, "-m", "siirl.main_dag", f"dag.workflow_path={workflow}",
           f"trainer.default_local_dir={run_dir}", f"trainer.ray_temp_dir={ray_dir}",
           *COMMON, *overrides]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS="")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=ROOT)  # the files name their process/env files from the root
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text()
            .splitlines()]


def _val_file(tmp_path):
    path = tmp_path / "val.jsonl"
    rows = [{"data_source": "arithmetic", "ability": "math",
             "prompt": [{"role": "user", "content": f"{i}+1="}],
             "reward_model": {"ground_truth": str(i + 1)}} for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_marft_math_trains_each_agent_and_resumes(tmp_path):
    run = tmp_path / "run"
    records = _run(run, MARFT / "workflow_marft.yaml", "trainer.total_training_steps=2",
                   "trainer.save_freq=2", "trainer.test_freq=-1",
                   "trainer.val_before_train=true", f"data.val_files={_val_file(tmp_path)}",
                   f"trainer.rollout_data_dir={tmp_path}/rollouts")
    val, train = records[0], records[1:]
    assert "val/score/mean" in val and "val/success_rate" in val
    assert [r["step"] for r in train] == [1, 2]
    for record in train:
        # each agent's own nodes report under its group
        for group in (0, 1):
            assert f"agent_group_{group}/critic/vf_loss" in record
            assert f"agent_group_{group}/critic/advantages/mean" in record
            assert f"agent_group_{group}/response_length/mean" in record
        assert record["multi_agent/turns/mean"] >= 1
        # train_cycle 15: agent group 0's actor trains in steps 1-15, group 1's waits
        assert "agent_group_0/actor/pg_loss" in record
        assert record["agent_group_1/actor_2_train/train_cycle_skipped"] == 1.0
        # the planner's: agent 0's update takes its old log-probs from its own first
        # forward; agent 1's old-log-prob node runs while its update waits for its turn
        assert "timing_s/actor_1_old_log_prob" not in record
        assert "timing_s/actor_2_old_log_prob" in record
    # each agent's turn as text, each worker its share of the trained rows
    lines = [json.loads(line) for rank in range(4) for line in
             (tmp_path / f"rollouts/1.rank{rank}.jsonl").read_text().splitlines()]
    assert sorted(line["agent_group"] for line in lines) == [0] * 8 + [1] * 8
    folder = run / "global_step_2"
    assert {"actor", "agent_group_1_actor", "critic"} <= {p.name for p in folder.iterdir()}
    resumed = _run(run, MARFT / "workflow_marft.yaml", "trainer.total_training_steps=3",
                   "trainer.test_freq=-1", "trainer.val_before_train=false")
    assert resumed[-1]["step"] == 3


@pytest.mark.skipif(os.environ.get("SIIRL_LAUNCH_SCRIPTS") != "all",
                    reason="4 workers: SIIRL_LAUNCH_SCRIPTS=all (nox -s launch_scripts)")
def test_marft_code_runs_with_environment_rewards(tmp_path):
    records = _run(tmp_path / "run", MARFT / "workflow_marft_code.yaml",
                   "trainer.total_training_steps=2", "trainer.test_freq=-1",
                   "trainer.val_before_train=false",
                   "actor_rollout_ref.rollout.agent.rewards_with_env=true")
    for record in records:
        assert "agent_group_1/reward/env_score/mean" in record
        assert record["multi_agent/env_errors"] == 0
        assert "agent_group_0/actor/pg_loss" in record


@pytest.mark.parametrize("workers", [1])
def test_marft_needs_workers_for_its_tensor_parallel_rollout(tmp_path, workers):
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    cmd = [sys.executable, "-m", "siirl.main_dag",
           f"dag.workflow_path={MARFT / 'workflow_marft.yaml'}", "trainer.device=cpu",
           f"trainer.default_local_dir={tmp_path}", f"trainer.ray_temp_dir={ray_dir}",
           f"trainer.n_gpus_per_node={workers}", "trainer.total_training_steps=1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=200,
                          env=dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS=""))
    assert proc.returncode != 0
    assert "tensor_model_parallel_size=4 must divide" in proc.stderr
    assert "Traceback" not in proc.stderr
