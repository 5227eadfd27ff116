"""The embodied reward: success scores 1, and SRPO's progress reward gives failed episodes
more the nearer their embedding lies to the same task's successes."""

import numpy as np
import pytest
import torch

from siirl.data_coordinator import protocol
from siirl.engine.reward_manager.embodied import EmbodiedRewardManager
from siirl.engine.reward_score.embodied import dbscan, progress_rewards, success_centres
from siirl.errors import DataError


def test_dbscan_finds_dense_groups_and_noise():
    points = np.array([[0, 0], [0.1, 0], [0, 0.1], [5, 5], [5.1, 5], [20, 20]], float)
    labels = dbscan(points, eps=0.5, min_samples=2)
    assert labels[0] == labels[1] == labels[2] != labels[3] == labels[4]
    assert labels[5] == -1


def test_success_centres_fall_back_to_the_mean_without_a_cluster():
    lonely = np.array([[0.0, 0.0], [10.0, 10.0]])
    centres = success_centres(lonely, eps=1e-3)
    assert np.allclose(centres, [[5.0, 5.0]])


def test_failures_nearer_success_earn_more_and_successes_earn_one():
    success = [True, True, False, False, False]
    embeddings = np.array([[0, 1], [0.2, 1], [1, 1], [3, 1], [9, 1]], float)
    rewards, distances = progress_rewards(embeddings, success, ["t"] * 5)
    assert rewards[0] == rewards[1] == 1.0
    assert rewards[2] > rewards[3] > rewards[4] > 0
    assert rewards[2] < 0.6  # a failure never reaches a success
    assert distances[2] == 0.0 and distances[4] == 1.0


def test_tasks_are_compared_only_with_themselves():
    success = [True, False, False, False]
    embeddings = np.array([[0, 1], [1, 1], [1, 1], [1, 1]], float)  # 0: not computed
    rewards, _ = progress_rewards(embeddings, success, ["a", "a", "b", "b"])
    assert rewards[1] == pytest.approx(0.6 / (1 + np.exp(-10 * 0.0)))  # one failure: 0.5
    assert rewards[2] == rewards[3] == 0.0  # task b has no success to compare with


def test_all_zero_embeddings_are_not_scored():
    rewards, distances = progress_rewards(np.zeros((3, 4)), [True, False, False], ["t"] * 3)
    assert list(rewards) == [1.0, 0.0, 0.0] and distances == {}


def _batch(complete, embeddings=None):
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)
    fields = {"response_mask": mask, "complete": torch.tensor(complete, dtype=torch.float32)}
    if embeddings is not None:
        fields["trajectory_embedding"] = torch.tensor(embeddings, dtype=torch.float32)
    batch = protocol.make_batch(fields)
    protocol.set_non_tensor(batch, "uid", ["g", "g", "g"])
    return batch


def test_the_manager_puts_the_scaled_score_on_the_last_token():
    out = EmbodiedRewardManager(reward_coef=5.0).compute_reward(
        _batch([1, 0, 0], [[0, 1], [1, 1], [4, 1]]))
    scores = out.batch["token_level_scores"]
    assert scores[0].tolist() == [0.0, 5.0, 0.0]
    assert scores[1, 0] > scores[2, 2] > 0 and scores[1, 1:].abs().sum() == 0
    assert out.metrics["reward/success_rate"] == pytest.approx(1 / 3)
    assert out.metrics["reward/progress/count"] == 2.0


def test_without_embeddings_only_success_scores():
    out = EmbodiedRewardManager().compute_reward(_batch([0, 1, 0]))
    assert out.batch["token_level_scores"].sum(dim=-1).tolist() == [0.0, 1.0, 0.0]


def test_rows_without_success_flags_are_refused():
    batch = protocol.make_batch({"response_mask": torch.ones(2, 2)})
    with pytest.raises(DataError, match="'complete'"):
        EmbodiedRewardManager().compute_reward(batch)
