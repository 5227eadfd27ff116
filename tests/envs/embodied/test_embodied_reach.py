"""The embodied API on the built-in ``reach`` family: observations, seeding, clipping,
the scripted expert, and lookup by name."""

import numpy as np
import pytest

from siirl.environment.embodied import (
    EmbodiedEnv,
    Reach2D,
    check_observation,
    clip_actions,
    embodied_env_names,
    expert_action,
    expert_chunk,
    make_embodied_env,
)
from siirl.environment.embodied.tasks.reach2d import CONTACT, potential
from siirl.errors import ConfigError


@pytest.fixture()
def env():
    with Reach2D(image_size=32) as env:
        yield env


def test_observation_and_step_follow_the_api(env):
    assert isinstance(env, EmbodiedEnv) and len(env.task_ids) >= 4 and env.action_dim == 2
    obs = env.reset("reach_red", seed=0)
    check_observation(obs)
    assert obs["image"].shape == (32, 32, 3) and obs["proprio"].shape == (4,)
    assert obs["instruction"] == "reach the red block"
    obs, reward, done, info = env.step(np.zeros((3, 2)))
    check_observation(obs)
    assert isinstance(reward, float) and isinstance(done, bool)
    assert info["success"] is False and info["clipped"] == 0 and info["steps"] == 3
    assert np.array_equal(env.render(), obs["image"])


def test_every_task_has_an_english_instruction(env):
    for task_id in env.task_ids:
        words = env.reset(task_id, 0)["instruction"].split()
        assert words[0] in ("reach", "push") and task_id.split("_")[1] in words


def test_same_seed_same_episode_other_seed_other_layout(env):
    first = env.reset("push_red_left", seed=7)
    again = env.reset("push_red_left", seed=7)
    other = env.reset("push_red_left", seed=8)
    assert np.array_equal(first["image"], again["image"])
    assert np.array_equal(first["proprio"], again["proprio"])
    assert not np.array_equal(first["image"], other["image"])


def test_out_of_range_actions_are_clipped_and_counted(env):
    env.reset("reach_blue", 0)
    _, _, _, info = env.step([[3.0, -0.5], [np.nan, -7.0]])
    assert info["clipped"] == 3
    chunk, count = clip_actions([2.0, 0.1], 2)
    assert count == 1 and chunk.tolist() == [[1.0, pytest.approx(0.1)]]
    with pytest.raises(ValueError, match="k, 2"):
        env.step(np.zeros((2, 3)))  # a wrong shape is a bug, not a clumsy sample


def test_unknown_task_id_names_the_tasks(env):
    with pytest.raises(ValueError, match="reach_red"):
        env.reset("fly_to_the_moon", 0)


@pytest.mark.parametrize("k,noise", [(1, 0.0), (4, 0.2)])
def test_expert_solves_every_task(env, k, noise):
    rng = np.random.default_rng(0)
    for task_id in env.task_ids:
        wins = 0
        for seed in range(20):
            env.reset(task_id, seed)
            done, total = False, 0.0
            while not done:
                chunk = expert_chunk(env, k, noise, rng) if k > 1 else \
                    expert_action(env, noise, rng)[None]
                _, reward, done, info = env.step(chunk)
                total += reward
            wins += info["success"]
            assert total == float(info["success"])  # sparse: 1.0 once, on success
        assert wins == 20, task_id


def _returns(env, task_id, policy, seeds=range(10)):
    """Per seed: (the episode's rewards summed, success, the start and end potentials)."""
    out = []
    for seed in seeds:
        env.reset(task_id, seed)
        start = potential(env.state, env.task)
        done, total = False, 0.0
        while not done:
            _, reward, done, info = env.step(policy(env)[None])
            total += reward
        out.append((total, info["success"], start, potential(env.state, env.task)))
    return out


@pytest.mark.parametrize("task_id", ["reach_blue", "push_yellow_down", "push_red_left"])
def test_shaped_rewards_sum_to_success_plus_the_potential_gained(task_id):
    shaped = Reach2D(image_size=16, max_steps=30, reward_shaping=True)
    rng = np.random.default_rng(1)
    wander = _returns(shaped, task_id, lambda e: rng.uniform(-1, 1, 2).astype(np.float32))
    expert = _returns(shaped, task_id, expert_action)
    for total, success, start, end in wander + expert:
        assert start <= 0.0 and end <= 0.0
        assert total == pytest.approx(float(success) + end - start, abs=1e-9)
    assert all(success for _, success, _, _ in expert)
    # the expert ends at its goal (potential 0, give or take contact), wandering does not
    assert max(-end for _, _, _, end in expert) < 0.1
    assert np.mean([t for t, *_ in expert]) > np.mean([t for t, *_ in wander]) + 1.0
    # the same episodes without shaping pay success alone
    plain = _returns(Reach2D(image_size=16, max_steps=30), task_id, expert_action)
    assert [t for t, *_ in plain] == [1.0] * len(plain)


def test_a_push_from_the_wrong_side_earns_less_than_staying_put():
    env = Reach2D(image_size=16, max_steps=8, reward_shaping=True)
    env.reset("push_yellow_down", 3)
    block = env.state.blocks[env.task.target].copy()
    env.state.gripper = block + np.array([0.0, -(CONTACT + 0.005)])  # below it: pushes it up
    start = potential(env.state, env.task)
    _, reward, _, _ = env.step(np.array([[0.0, 1.0]] * 4, np.float32))
    assert env.state.blocks[env.task.target][1] > block[1] and reward < 0.0
    assert reward == pytest.approx(potential(env.state, env.task) - start)


def test_episode_ends_at_max_steps():
    env = Reach2D(image_size=16, max_steps=5)
    env.reset("push_green_right", 0)
    _, _, done, info = env.step(np.zeros((4, 2)))
    assert not done
    _, _, done, info = env.step(np.zeros((4, 2)))  # only one of these runs
    assert done and not info["success"] and info["steps"] == 5


def test_lookup_by_name():
    assert "reach" in embodied_env_names()
    env = make_embodied_env("reach", {"image_size": 24, "tasks": ["reach_red"]})
    assert env.task_ids == ["reach_red"] and env.reset("reach_red", 0)["image"].shape[0] == 24
    with pytest.raises(ConfigError, match="reach"):
        make_embodied_env("no_such_sim")
    with pytest.raises(ConfigError, match="image_size"):
        make_embodied_env("reach", {"img_size": 24})
    with pytest.raises(ConfigError, match="not an EmbodiedEnv"):
        make_embodied_env("sokoban")  # a text environment
