"""The main job with verl's rollout correction (``algorithm.rollout_correction``) on CPU:
the hf rollout reports its log-probs, the actor weighs its loss by them and logs verl's
``rollout_corr/`` metrics."""

import pytest
from test_main_job import SMALL, siirl_train, training

SHORT = [*SMALL, "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
         "trainer.total_training_steps=2", "trainer.test_freq=-1",
         "trainer.val_before_train=false"]


def test_token_importance_weights_run_and_log_their_metrics(tmp_path):
    siirl_train(tmp_path, *SHORT, "algorithm.rollout_correction.rollout_is=token")
    steps = training(tmp_path)
    assert sorted(steps) == [1, 2]
    for step in steps.values():
        for key in ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_eff_sample_size",
                    "rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/chi2_token",
                    "rollout_corr/training_ppl", "rollout_corr/rollout_ppl"):
            assert key in step, key
        # synchronous: the rollout sampled with the weights the old log-probs read, so the
        # two agree up to float32 rounding (a KV-cached decode against one forward)
        assert step["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-4)
        assert abs(step["rollout_corr/kl"]) < 1e-4
        # the weights need the old log-probs before the update: the node runs
        assert "timing_s/actor_old_log_prob" in step
