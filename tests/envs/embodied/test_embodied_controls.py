"""actor_rollout_ref.embodied.env.action_order / action_signs (the permuted-actions learning
control): the environment gets the policy's actions permuted and negated as set, so the
reach expert's own actions miss while the ones mapped back succeed; bad maps are refused."""

import numpy as np
import pytest

from siirl.environment.embodied import Reach2D, expert_action
from siirl.environment.embodied.controls import action_map, env_action_map
from siirl.errors import ConfigError
from siirl.params.parser import parse_config
from siirl.params.typed import to_typed


def test_each_env_dimension_takes_its_policy_dimension_and_sign():
    chunk = np.array([[[0.5, -0.25], [1.0, 0.0]]], dtype=np.float32)
    assert action_map([], [], 2) is None
    assert np.array_equal(action_map([1, 0], [], 2)(chunk), chunk[..., ::-1])
    mirrored = action_map([], [-1, 1], 2)(chunk)
    assert np.array_equal(mirrored[..., 0], -chunk[..., 0])
    assert np.array_equal(mirrored[..., 1], chunk[..., 1])


def _successes(remap, said):
    """reach episodes of the expert, its actions said as ``said`` and sent through ``remap``"""
    wins = 0
    for seed in range(20):
        env = Reach2D(max_steps=48)
        env.reset("reach_red", seed)
        done, info = False, {}
        while not done:
            _, _, done, info = env.step(remap(said(expert_action(env))[None]))
        wins += bool(info["success"])
    return wins / 20


def test_the_taught_actions_miss_and_the_mapped_ones_succeed():
    mirror = action_map([], [-1, 1], 2)
    assert _successes(mirror, lambda a: a * np.array([-1, 1])) == 1.0
    assert _successes(mirror, lambda a: a) <= 0.3  # only blocks near the start's x


def test_the_keys_reach_the_rollout_from_the_config():
    config = to_typed(parse_config(["actor_rollout_ref.embodied.env.action_signs=[-1,1]"],
                                   check_support=False))
    assert env_action_map(config, 2)(np.ones((1, 2), np.float32)).tolist() == [[-1.0, 1.0]]
    assert env_action_map(to_typed(parse_config([], check_support=False)), 2) is None


@pytest.mark.parametrize("order, signs, key", [
    ([0, 0], [], "action_order"), ([0, 1, 2], [], "action_order"),
    ([], [-1], "action_signs"), ([], [2, 1], "action_signs")])
def test_maps_that_are_not_permutations_or_signs_are_refused(order, signs, key):
    with pytest.raises(ConfigError, match=f"actor_rollout_ref.embodied.env.{key}="):
        action_map(order, signs, 2)
