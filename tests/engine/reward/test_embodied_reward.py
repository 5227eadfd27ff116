"""The embodied reward: success scores 1, and SRPO's progress reward gives failed episodes
more the nearer their embedding lies to the same task's successes (end to end: reach
episodes embedded by the builtin video encoder). With the batch split over two simulated
workers, each failure is still compared with its task's successes on both (``siirl_workers``).
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from siirl.data_coordinator import protocol
from siirl.engine.reward_manager.embodied import EmbodiedRewardManager
from siirl.engine.reward_score.embodied import dbscan, progress_rewards, success_centres
from siirl.environment.embodied import Reach2D, expert_action
from siirl.environment.embodied.video_embedding import build_video_encoder
from siirl.errors import DataError
from siirl_workers import on_workers


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


def _split_batch(seed=0):
    """12 episodes of two tasks: task a's successes all in the first 5 rows, most of its
    failures in the rest; two clusters of successes, one never-computed embedding."""
    rng = np.random.default_rng(seed)
    tasks = np.array(list("abaabaababab"))
    success = np.array([1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0], dtype=bool)
    embeddings = rng.normal(size=(12, 3))
    embeddings[0] += 4.0  # task a's successes: one far from the others
    embeddings[11] = 0.0  # never computed: not scored
    return embeddings, success, tasks


def test_two_workers_score_each_failure_against_the_whole_batch():
    embeddings, success, tasks = _split_batch()
    whole, whole_distances = progress_rewards(embeddings, success, tasks)
    # worker 1 holds failures of task a and no success of it: alone it would leave them at 0
    alone, _ = progress_rewards(embeddings[5:], success[5:], tasks[5:])
    assert alone[[0, 1, 3, 5]].tolist() == [0.0] * 4 and whole[[5, 6, 8, 10]].min() > 0
    parts = on_workers(lambda rows, reduction: progress_rewards(
        embeddings[rows], success[rows], list(tasks[rows]),
        reduction=reduction), [slice(0, 5), slice(5, 12)])
    assert np.array_equal(np.concatenate([parts[0][0], parts[1][0]]), whole)
    distances = {**parts[0][1], **{row + 5: d for row, d in parts[1][1].items()}}
    assert distances == whole_distances


def test_a_tensor_parallel_copy_of_rows_adds_nothing():
    embeddings, success, tasks = _split_batch(1)
    whole, _ = progress_rewards(embeddings, success, tasks)
    halves = [slice(0, 6), slice(6, 12), slice(6, 12)]  # worker 2 holds worker 1's copy
    parts = on_workers(lambda rows, reduction: progress_rewards(
        embeddings[rows], success[rows], list(tasks[rows]),
        reduction=reduction)[0], halves, contributes=[True, True, False])
    assert np.array_equal(np.concatenate(parts[:2]), whole)
    assert np.array_equal(parts[2], parts[1])


def test_success_clusters_do_not_depend_on_the_order_of_the_successes():
    points = np.random.default_rng(3).normal(size=(9, 4))
    points[:4] += 3.0
    centres = success_centres(points)
    assert np.array_equal(success_centres(points[::-1]), centres)
    assert np.array_equal(success_centres(points[[4, 0, 8, 2, 6, 1, 7, 3, 5]]), centres)


def test_the_manager_on_two_workers_scores_and_reports_like_one():
    embeddings, success, tasks = _split_batch(2)

    def batch_of(rows):
        batch = protocol.make_batch({
            "response_mask": torch.ones(len(rows), 3),
            "complete": torch.tensor(success[rows], dtype=torch.float32),
            "trajectory_embedding": torch.tensor(embeddings[rows], dtype=torch.float32)})
        protocol.set_non_tensor(batch, "task_id", list(tasks[rows]))
        return batch

    one = EmbodiedRewardManager().compute_reward(batch_of(list(range(12))))

    def on_worker(rows, reduction):  # the worker's comm, as the reward node's worker has
        manager = EmbodiedRewardManager(worker=SimpleNamespace(comm=reduction.comm))
        return manager.compute_reward(batch_of(rows))

    two = on_workers(on_worker, [list(range(7)), list(range(7, 12))])
    scores = torch.cat([out.batch["token_level_scores"] for out in two])
    assert torch.equal(scores, one.batch["token_level_scores"])
    for out in two:  # the global mean on each worker; counts add up over the workers
        assert out.metrics["reward/progress/mean"] == one.metrics["reward/progress/mean"]
    assert sum(out.metrics["reward/progress/count"] for out in two) == \
        one.metrics["reward/progress/count"] > 0
