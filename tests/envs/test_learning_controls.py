"""The AGENTIC learning controls (custom_envs.<tag>.action_words and reward: coin_flip): a
permutation sends the agent's word to another action, a coin replaces every reward whatever
the agent did, and bad settings are refused naming the key."""

import pytest
from test_trajectory_manager import char_tokenizer

from siirl.environment import make_env
from siirl.environment import text_controls as controls
from siirl.environment.agentic import TrajectoryEnvManager
from siirl.environment.config.agentic import control_problems
from siirl.errors import ConfigError

pytest.importorskip("gymnasium")

SWAP = {"Left": "Right", "Right": "Left", "Up": "Down", "Down": "Up"}


def _play(words, replies, seed=3):
    """One FrozenLake episode replying ``replies`` in turn; the episode."""
    tok = char_tokenizer(chat=False)
    manager = TrajectoryEnvManager(tok, max_actions_per_traj=len(replies))
    episode = manager.start(make_env("frozen_lake", {"size": 4}), seed, group="g")
    episode.action_words = words
    turn = iter(replies)
    manager.run([episode], lambda prompts: [
        tok.encode(f"<answer>{next(turn)}</answer>", add_special_tokens=False)
        for _ in prompts])
    return episode


def test_permuted_words_move_the_agent_where_the_permutation_says():
    from siirl.environment import frozen_lake

    env = make_env("frozen_lake", {"size": 4})
    env.reset(seed=3)
    plan = frozen_lake.solve(env)
    env.close()
    assert _play(None, plan).success
    said = [{v: k for k, v in SWAP.items()}[a] for a in plan]  # what to say under SWAP
    mapping = controls.action_words("Lake", {"action_words": SWAP})
    assert _play(mapping, said).success
    assert not _play(mapping, plan).success  # the taught words now go the other way


def test_words_are_matched_ignoring_case_and_others_pass_unchanged():
    mapping = controls.action_words("T", {"action_words": {"left": "Up"}})
    assert controls.said_to_env(mapping, " LEFT ") == "Up"
    assert controls.said_to_env(mapping, "Down") == "Down"
    assert controls.said_to_env(None, "Down") == "Down"


@pytest.mark.parametrize("words, says", [
    ({"Left": "Up", "Right": "Up"}, "two words to one action"),
    (["Left", "Up"], "must map the words"),
    ({"Left": ""}, "must map the words"),
])
def test_a_bad_permutation_is_refused_naming_the_key(words, says):
    with pytest.raises(ConfigError, match=says) as info:
        controls.action_words("Lake", {"action_words": words})
    assert "custom_envs.Lake.action_words" in str(info.value)


def test_the_coin_ignores_behaviour_and_is_fair_and_replayable():
    tok = char_tokenizer(chat=False)
    manager = TrajectoryEnvManager(tok, max_actions_per_traj=2)

    def episode(key, reward, turns):
        e = manager.start(make_env("frozen_lake", {"size": 4}), 5, group="g", key=key)
        e.reward, e.turn_rewards = reward, [reward / turns] * turns
        return e

    coins = []
    for key in range(400):
        # the same key pays the same coin whatever the episode scored or how long it ran
        a, b = episode(key, 1.0, 1), episode(key, -0.3, 3)
        controls.coin_flip(a, run_seed=1, step=4)
        controls.coin_flip(b, run_seed=1, step=4)
        assert a.reward == b.reward == a.turn_rewards[-1] == b.turn_rewards[-1]
        assert b.turn_rewards[:-1] == [0.0, 0.0]
        coins.append(a.reward)
    assert set(coins) == {0.0, 1.0}
    assert 0.4 < sum(coins) / len(coins) < 0.6  # 400 fair coins: 5 standard deviations
    replay = episode(7, 0.0, 1)
    controls.coin_flip(replay, run_seed=1, step=4)
    assert replay.reward == coins[7]


def test_the_config_check_names_each_bad_entry():
    config = {"custom_envs": {
        "A": {"env_type": "frozen_lake", "reward": "coin"},
        "B": {"env_type": "frozen_lake", "action_words": {"Left": "Up", "Up": "Up"}},
        "C": {"env_type": "frozen_lake", "reward": "coin_flip",
              "action_words": {"Left": "Up", "Up": "Left"}}}}
    problems = control_problems(config)
    assert len(problems) == 2
    assert "custom_envs.A.reward='coin'" in problems[0]
    assert "custom_envs.B.action_words" in problems[1]
