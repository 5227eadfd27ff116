"""Model-based rewards end to end (CPU, the built-in task): ``siirl-train`` GRPO for 2 steps
with the built-in tiny reward model, and with the generative judge (the policy's own
rollout engine). Each step's score is the rule score plus rm_weight times the model's."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from siirl_suites import megatron_full

SMALL = ["algorithm.adv_estimator=grpo", "data.train_batch_size=8",
         "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
         "trainer.logger=[]", "trainer.val_before_train=false", "trainer.test_freq=-1",
         "trainer.device=cpu", "trainer.total_training_steps=2", "trainer.save_freq=-1"]


def siirl_train(run_dir, *overrides, env=None):
    script = Path(sys.executable).with_name("siirl-train")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "siirl.main_dag"]
    proc = subprocess.run([*command, f"trainer.default_local_dir={run_dir}", *SMALL,
                           "reward_model.enable=true", *overrides], capture_output=True,
                          text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text()
               .splitlines()]
    steps = {r["step"]: r for r in records if "critic/score/mean" in r}
    assert sorted(steps) == [1, 2]
    return proc, steps


def test_grpo_with_the_tiny_reward_model(tmp_path):
    _, steps = siirl_train(tmp_path / "run", "reward_model.model.path=builtin:tiny-reward",
                           "reward_model.rm_weight=0.5", "reward_model.micro_batch_size_per_gpu=8")
    for record in steps.values():
        assert 0.0 <= record["reward/rule/mean"] <= 1.0
        assert record["reward/rm/std"] > 0.0 and "timing_s/reward_model" in record
        # every row has a rule here: the step's score is rule + 0.5 x model on average
        assert record["critic/score/mean"] == pytest.approx(
            record["reward/rule/mean"] + 0.5 * record["reward/rm/mean"], abs=1e-5)
        assert record["actor/grad_norm"] > 0


def test_grpo_with_the_generative_judge(tmp_path):
    _, steps = siirl_train(tmp_path / "run", "reward_model.style=generative",
                           "reward_model.judge.max_new_tokens=4")
    for record in steps.values():
        assert 0.0 <= record["reward/rm/mean"] <= 1.0
        assert 0.0 <= record["reward/rm/unparsed"] <= 32.0
        assert record["critic/score/mean"] == pytest.approx(
            record["reward/rule/mean"] + record["reward/rm/mean"], abs=1e-5)


def test_two_workers_shard_the_reward_model_and_score_like_one(tmp_path):
    # FSDP2 shards the frozen model over both workers (fsdp_size=-1); the rows split
    model = ["reward_model.model.path=builtin:tiny-reward",
             "reward_model.micro_batch_size_per_gpu=4", "trainer.seed=7"]
    _, one = siirl_train(tmp_path / "one", *model)
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths
    _, two = siirl_train(tmp_path / "two", *model, "trainer.n_gpus_per_node=2",
                         "trainer.ray_address=local", f"trainer.ray_temp_dir={ray_dir}",
                         env={"RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""})
    for key in ("reward/rm/mean", "reward/rule/mean", "critic/score/mean"):
        assert two[1][key] == pytest.approx(one[1][key], abs=1e-5), key


def test_the_megatron_reward_model_scores_like_the_fsdp_one(tmp_path):
    # reward_model.strategy=megatron: the tiny classifier as a megatron GPTModel with its
    # score head; same seed, same rollouts, so the same scores each step (float32)
    pytest.importorskip("megatron.core")
    model = ["reward_model.model.path=builtin:tiny-reward", "trainer.seed=7"]
    _, fsdp = siirl_train(tmp_path / "fsdp", *model)
    _, megatron = siirl_train(tmp_path / "megatron", *model, "reward_model.strategy=megatron")
    for step in (1, 2):
        for key in ("reward/rm/mean", "reward/rm/std", "critic/score/mean"):
            assert megatron[step][key] == pytest.approx(fsdp[step][key], abs=1e-5), (step, key)


@megatron_full
def test_the_megatron_reward_model_at_tp_2_on_two_workers(tmp_path):
    # the actor and the reward model on megatron, TP=2 over two gloo workers: the reward
    # node's rows are gathered over the TP pair and scored like one fsdp worker scores them
    pytest.importorskip("megatron.core")
    model = ["reward_model.model.path=builtin:tiny-reward", "trainer.seed=7"]
    _, one = siirl_train(tmp_path / "one", *model)
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    _, two = siirl_train(tmp_path / "two", *model, "reward_model.strategy=megatron",
                         "actor_rollout_ref.actor.strategy=megatron",
                         "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                         "trainer.n_gpus_per_node=2", "trainer.ray_address=local",
                         f"trainer.ray_temp_dir={ray_dir}",
                         env={"RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""})
    # (each worker's std is of its own rows: not compared)
    for key in ("reward/rm/mean", "critic/score/mean"):
        assert two[1][key] == pytest.approx(one[1][key], abs=1e-5), key
