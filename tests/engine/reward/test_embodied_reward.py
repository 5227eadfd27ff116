"""The embodied reward: success scores 1, and SRPO's progress reward gives failed episodes
more the nearer their embedding lies to the same task's successes (end to end: reach
episodes embedded by the builtin video encoder)."""

import numpy as np
import pytest
import torch

from siirl.data_coordinator import protocol
from siirl.engine.reward_manager.embodied import EmbodiedRewardManager
from siirl.engine.reward_score.embodied import dbscan, progress_rewards, success_centres
from siirl.environment.embodied import Reach2D, expert_action
from siirl.environment.embodied.video_embedding import build_video_encoder
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


def _reach_episode(expert_steps, then="still", noise=0.0, rng_seed=0):
    """Frames of one reach_red episode (seed 1: the block starts 0.74 away), the expert
    for ``expert_steps`` actions, then standing still or backing away; (frames, success,
    the gripper's final distance to the block)."""
    env = Reach2D(image_size=64, max_steps=20)
    rng = np.random.default_rng(rng_seed)
    frames = [env.reset("reach_red", 1)["image"]]
    done, info = False, {}
    while not done:
        action = expert_action(env, noise, rng)
        if env.state.steps >= expert_steps:
            action = -action if then == "away" else np.zeros_like(action)
        obs, _, done, info = env.step(action[None])
        frames.append(obs["image"])
    gap = np.linalg.norm(env.state.gripper - env.state.blocks[env.task.target])
    return np.stack(frames), bool(info["success"]), float(gap)


def test_srpo_on_reach_videos_pays_failures_by_how_near_they_got():
    """End to end: real reach episodes, the builtin video encoder, the progress reward."""
    episodes = [_reach_episode(99, noise=0.2, rng_seed=s) for s in range(3)]  # successes
    episodes += [_reach_episode(j) for j in (0, 3, 6, 9)]
    episodes += [_reach_episode(j, then="away") for j in (2, 4)]
    videos, success, gaps = zip(*episodes, strict=True)
    assert success == (True,) * 3 + (False,) * 6
    assert len({len(v) for v in videos}) > 1  # successes end early, failures run out

    embeddings = build_video_encoder("builtin").embed(videos)
    rewards, _ = progress_rewards(embeddings, success, ["reach_red/1"] * len(videos))
    assert list(rewards[:3]) == [1.0, 1.0, 1.0]
    failures = np.argsort(gaps[3:]) + 3  # nearest to the block first
    assert np.all(np.diff(rewards[failures]) < 0), (np.array(gaps)[failures],
                                                    rewards[failures])
    assert np.all(rewards[3:] < 1.0) and np.all(rewards[3:] > 0)
