"""Each algorithm end to end on the built-in task and model (CI-sized runs on CPU).

GRPO is covered by test_main_job; here PPO (critic + GAE), DAPO (dynamic sampling,
clip-higher, overlong buffer), GSPO and CPGD must each raise the training reward, critic
warm-up must hold the actor still for exactly k steps, and an adaptive KL controller must
continue exactly across a resume.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SMALL = ["data.train_batch_size=32", "actor_rollout_ref.rollout.n=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=32", "trainer.logger=[]",
         "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1"]


def train(run_dir, *overrides, ok=True, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag",
                           f"trainer.default_local_dir={run_dir}", *SMALL, *overrides],
                          capture_output=True, text=True, timeout=timeout)
    assert (proc.returncode == 0) == ok, proc.stderr[-3000:]
    return proc


def steps(run_dir):
    return {r["step"]: r for r in map(json.loads, (Path(run_dir) / "metrics.jsonl")
                                      .read_text().splitlines()) if "critic/score/mean" in r}


def assert_reward_rises(run_dir, count):
    got = steps(run_dir)
    assert sorted(got) == list(range(1, count + 1))
    window = count // 4
    first = sum(got[s]["critic/score/mean"] for s in range(1, window + 1)) / window
    last = sum(got[s]["critic/score/mean"] for s in range(count - window + 1, count + 1)) / window
    assert last > first + 0.05, (first, last)
    return got


STEPS = 40  # first vs last quarter: +0.05 is clear of step-to-step noise at this length
ALGORITHMS = {
    "ppo": ["algorithm.adv_estimator=gae"],
    "dapo": ["algorithm.workflow_type=DAPO", "algorithm.filter_groups.enable=true",
             "algorithm.filter_groups.metric=acc", "algorithm.filter_groups.max_num_gen_batches=8",
             "actor_rollout_ref.actor.clip_ratio_high=0.28",
             "reward_model.reward_manager=dapo", "reward_model.overlong_buffer.enable=true",
             "reward_model.overlong_buffer.len=2",
             "reward_model.overlong_buffer.penalty_factor=0.5"],
    "gspo": ["algorithm.adv_estimator=gspo", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
             "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"],
    "cpgd": ["algorithm.adv_estimator=cpgd", "actor_rollout_ref.actor.policy_loss.loss_mode=cpgd"],
}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_algorithm_raises_reward(name, tmp_path):
    train(tmp_path, f"trainer.total_training_steps={STEPS}", *ALGORITHMS[name])
    got = assert_reward_rises(tmp_path, STEPS)
    if name == "ppo":
        assert "critic/vf_loss" in got[STEPS]
    if name == "dapo":
        assert got[STEPS]["dynamic_sampling/num_gen_batches"] >= 1
        assert "reward/overlong_penalty/mean" in got[STEPS]


def test_critic_warmup_holds_the_actor_for_exactly_k_steps(tmp_path):
    from siirl.engine.common.checkpoint import MODEL_FILE, load_tensors

    train(tmp_path, "algorithm.adv_estimator=gae", "trainer.critic_warmup=3",
          "trainer.total_training_steps=4", "trainer.save_freq=1")

    def weights(step, role):
        return load_tensors(str(tmp_path / f"global_step_{step}" / role / MODEL_FILE))

    def same(a, b):
        return all((a[k] == b[k]).all() for k in a)

    actor = [weights(step, "actor") for step in (1, 2, 3, 4)]
    assert same(actor[0], actor[1]) and same(actor[1], actor[2])  # steps 1-3: no update
    assert not same(actor[2], actor[3])  # step 4: the actor trains
    assert not same(weights(1, "critic"), weights(3, "critic"))  # the critic trained
    got = steps(tmp_path)
    assert [got[s].get("actor/critic_warmup") for s in (1, 2, 3, 4)] == [1.0, 1.0, 1.0, None]


def test_adaptive_kl_controller_resumes_exactly(tmp_path):
    kl = ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
          "algorithm.kl_ctrl.target_kl=0.01", "algorithm.kl_ctrl.horizon=100",
          "trainer.save_freq=2"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train(whole, *kl, "trainer.total_training_steps=4")
    train(parts, *kl, "trainer.total_training_steps=2")
    train(parts, *kl, "trainer.total_training_steps=4")  # resumes from global_step_2
    a, b = steps(whole), steps(parts)
    coeffs = [a[s]["actor/reward_kl_penalty_coeff"] for s in (1, 2, 3, 4)]
    assert len(set(coeffs)) == 4  # the coefficient adapts every step
    for s in (3, 4):
        assert b[s]["actor/reward_kl_penalty_coeff"] == a[s]["actor/reward_kl_penalty_coeff"]
        assert b[s]["actor/reward_kl_penalty"] == pytest.approx(a[s]["actor/reward_kl_penalty"],
                                                                abs=1e-6)


@pytest.mark.parametrize("key,value,listed", [
    ("algorithm.adv_estimator", "nope", "grpo"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "nope", "vanilla"),
])
def test_unknown_algorithm_name_fails_at_start_up(tmp_path, key, value, listed):
    proc = train(tmp_path, f"{key}={value}", "trainer.total_training_steps=2", ok=False)
    assert proc.returncode == 2
    assert "nope" in proc.stderr and listed in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing ran
