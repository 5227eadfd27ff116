"""Asynchronous training with megatron trainer workers (the rollout worker holds an fsdp
copy of the policy, refreshed by the syncs).

* At lag 0 one megatron trainer and one rollout worker train exactly like the synchronous
  megatron run: megatron's groups and its optimizer's gathers stay within the trainers.
* Two trainers at TP 2 beside one rollout worker (``nox -s megatron``): the TP peers read
  the same rows, checkpoints save, and the same command with more steps resumes, every
  prompt trained once.
"""

from pathlib import Path

import pytest
from test_async_training import ASYNC, train, trained_prompts, training

from siirl_suites import megatron_full

MEGATRON = ["actor_rollout_ref.actor.strategy=megatron"]


def test_lag_zero_on_a_megatron_trainer_trains_like_the_synchronous_run(tmp_path):
    pytest.importorskip("megatron.core")
    common = ["trainer.total_training_steps=3", "trainer.test_freq=-1",
              "trainer.val_before_train=false", *MEGATRON]
    train(tmp_path / "sync", *common, "trainer.ray_address=null")  # one worker, no Ray
    train(tmp_path / "async", *common, *ASYNC, "async_training.staleness_threshold=0")
    a, b = training(tmp_path / "sync"), training(tmp_path / "async")
    assert sorted(a) == sorted(b) == [1, 2, 3]
    for step in a:
        assert b[step]["async/policy_lag/max"] == 0
        assert b[step]["weight_sync/bytes"] > 0
        for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm",
                    "response_length/mean"):
            assert a[step][key] == b[step][key], (step, key)


@megatron_full
def test_two_tensor_parallel_trainers_save_and_resume(tmp_path):
    pytest.importorskip("megatron.core")
    overrides = [*MEGATRON, *ASYNC, "async_training.staleness_threshold=1",
                 "trainer.n_gpus_per_node=2",
                 "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                 "trainer.test_freq=-1", "trainer.val_before_train=false",
                 "trainer.save_freq=2"]
    train(tmp_path, "trainer.total_training_steps=2", *overrides)
    proc = train(tmp_path, "trainer.total_training_steps=4", *overrides)
    assert "resumed from" in proc.stdout + proc.stderr
    steps = training(tmp_path)
    assert sorted(steps) == [1, 2, 3, 4]
    assert all(r["async/policy_lag/max"] <= 1 for r in steps.values())
    prompts = trained_prompts(tmp_path)
    trained = [p for step in sorted(prompts) for p in prompts[step]]
    assert sorted(trained) == list(range(4 * 16))  # each once, the TP peers' counted once
    assert (Path(tmp_path) / "global_step_4").is_dir()
