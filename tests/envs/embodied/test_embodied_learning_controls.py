"""The EMBODIED learning controls, short (the full runs: tests/e2e/learning_controls, nox -s
learning_controls). A coin-flip reward pays episodes whatever they did and a few steps of
it do not raise greedy validation; with x mirrored (env.action_signs=[-1,1], as the presets
play) the tiny VLA, taught the reach tasks' own axes, starts near zero where it otherwise
succeeds."""

from embodied_runs import COIN_FLIP, TAUGHT_AXES, siirl_train, validations

SHORT = ["data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"]


def test_a_coin_flip_reward_is_paid_blind_and_does_not_raise_validation(tmp_path):
    records = siirl_train("embodied_grpo.yaml", tmp_path, COIN_FLIP, *SHORT,
                          "trainer.total_training_steps=3", "trainer.test_freq=3",
                          val_rows=24)
    steps = [r for r in records if "reward/score/mean" in r]
    assert len(steps) == 3
    # the coin, not success: the paid mean leaves the success rate in some step
    assert any(r["reward/score/mean"] != r["reward/success_rate"] for r in steps)
    greedy = validations(records)
    assert sorted(greedy) == [0, 3]
    assert greedy[3] <= greedy[0] + 0.10


def test_mirrored_actions_start_near_zero_where_the_taught_ones_succeed(tmp_path):
    taught = validations(siirl_train("embodied_grpo.yaml", tmp_path / "taught", TAUGHT_AXES,
                                     "trainer.val_only=true", val_rows=24))[0]
    mirrored = validations(siirl_train("embodied_grpo.yaml", tmp_path / "mirrored",
                                       "trainer.val_only=true", val_rows=24))[0]
    assert taught >= 0.6 and mirrored <= 0.25, (taught, mirrored)
