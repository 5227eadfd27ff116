"""The GEM and TextArena adapters: scripted policies win games through the TextEnv API,
seeds replay episodes, a missing suite names its extra, and a short AGENTIC run plays a
GEM game."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from siirl.environment import make_env
from siirl.errors import ConfigError, PluginNotFoundError

needs_gem = pytest.mark.skipif(importlib.util.find_spec("gem") is None,
                               reason="gem-llm is not installed (pip install "
                                      "\"siirl-envs[gem]\")")
needs_textarena = pytest.mark.skipif(importlib.util.find_spec("textarena") is None,
                                     reason="textarena is not installed (pip install "
                                            "\"siirl-envs[textarena]\")")


def guess_by_bisection(env, low, high, wrap=lambda n: f"<answer>{n}</answer>"):
    """Binary search through the adapter; (transcript, last reward, info)."""
    transcript = []
    while True:
        guess = (low + high) // 2
        observation, reward, done, info = env.step(env.parse_action(wrap(guess)))
        transcript.append((guess, observation))
        if done:
            return transcript, reward, info
        if "higher" in observation:
            low = guess + 1
        else:
            high = guess - 1


@needs_gem
def test_gem_guess_the_number_is_won_by_binary_search():
    env = make_env("gem", {"env_id": "game:GuessTheNumber-v0-hard"})  # 1..50, 7 turns
    assert "<answer>" in env.instructions
    for seed in range(5):
        assert "Guess The Number" in env.reset(seed=seed)
        _, reward, info = guess_by_bisection(env, 1, 50)
        assert info["success"] and reward == 1.0
    env.close()


@needs_gem
def test_gem_actions_follow_the_answer_convention_and_the_native_one():
    env = make_env("gem", {"env_id": "game:GuessTheNumber-v0-easy"})
    assert env.parse_action("so <answer> 7 </answer>") == "\\boxed{7}"
    assert env.parse_action("<answer>\\boxed{7}</answer>") == "\\boxed{7}"
    assert env.parse_action("my guess is \\boxed{3}") == "my guess is \\boxed{3}"
    assert env.parse_action("seven") is None  # the env manager's format penalty
    with pytest.raises(ConfigError, match="GuessTheNumber"):
        make_env("gem", {"env_id": "GuessTheNumber"}).reset(seed=0)


@needs_gem
def test_gem_seeds_replay_episodes_whatever_else_runs():
    def transcript(seed, interleave):
        env = make_env("gem", {"env_id": "game:GuessTheNumber-v0-hard"})
        other = make_env("gem", {"env_id": "game:Minesweeper-v0-easy"})
        env.reset(seed=seed)
        if interleave:  # another environment draws from its generator in between
            other.reset(seed=seed + 1)
            other.step("\\boxed{reveal 2 2}")
        return guess_by_bisection(env, 1, 50)[0]

    assert transcript(11, False) == transcript(11, True)
    assert transcript(11, False) != transcript(12, False)


@needs_gem
def test_gem_minesweeper_is_cleared_by_an_oracle():
    env = make_env("gem", {"env_id": "game:Minesweeper-v0-easy"})
    env.reset(seed=4)
    observation, reward, done, info = env.step(env.parse_action("<answer>reveal 0 0</answer>"))
    game = env.suite_env
    while not done:  # GEM checks for a cleared board (every mine flagged, every safe
        # cell revealed) after a reveal: flags first
        move = next((f"flag {r} {c}" for r in range(game.rows) for c in range(game.cols)
                     if game.grid[r][c] == -1 and not game.flags[r][c]), None) or \
            next(f"reveal {r} {c}" for r in range(game.rows) for c in range(game.cols)
                 if game.grid[r][c] != -1 and not game.revealed[r][c])
        observation, reward, done, info = env.step(env.parse_action(f"<answer>{move}</answer>"))
    assert info["success"], observation


@needs_gem
def test_gem_math_with_the_python_tool():
    env = make_env("gem", {"env_id": "rg:basic_arithmetic", "tool": "python"})
    question = env.reset(seed=3)
    assert "<python>" in question  # GEM's tool instructions
    expression = env.suite_env.unwrapped.data["metadata"]["expression"]
    call = env.parse_action(f"Let me compute.\n<python>print({expression})</python>")
    observation, reward, done, info = env.step(call)
    assert not done and "Code execution result" in observation
    value = observation.split("Code execution result:")[1].split()[0]
    observation, reward, done, info = env.step(env.parse_action(f"<answer>{value}</answer>"))
    assert done and info["success"] and reward == 1.0
    env.reset(seed=3)
    _, _, done, info = env.step(env.parse_action("<answer>0.5</answer>"))
    assert done and not info["success"]


@needs_textarena
def test_textarena_guess_the_number_is_won_by_binary_search():
    env = make_env("textarena", {"env_id": "GuessTheNumber-v0"})  # 1..20
    for seed in range(4):
        first = env.reset(seed=seed)
        assert "[5]" in first  # TextArena's own prompt; the adapter adds the brackets
        transcript, reward, info = guess_by_bisection(env, 1, 20)
        assert info["success"] and reward == 1.0
        assert all("[" not in obs for _, obs in transcript[:-1])  # no echo of own move
    env.reset(seed=7)
    again = make_env("textarena", {"env_id": "GuessTheNumber-v0"})
    again.reset(seed=7)
    assert guess_by_bisection(env, 1, 20)[0] == guess_by_bisection(again, 1, 20)[0]


def highest_free_cell(observation):
    free = [int(n) for n in re.findall(r"\[(\d)\]", observation)]
    return f"[{max(free)}]"


@needs_textarena
def test_textarena_two_player_game_against_a_fixed_opponent():
    env = make_env("textarena", {"env_id": "TicTacToe-v0", "opponent": highest_free_cell})
    observation = env.reset(seed=0)
    reward, moves = 0.0, 0
    for move in (0, 1, 2):  # the top row, while the opponent takes 8 and 7
        observation, reward, done, info = env.step(env.parse_action(f"<answer>{move}</answer>"))
        moves += 1
        assert done == (move == 2), observation
    assert info["success"] and reward == 1.0
    with pytest.raises(ConfigError, match="opponent"):
        make_env("textarena", {"env_id": "TicTacToe-v0"}).reset(seed=0)


def test_a_missing_suite_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gem", None)  # import gem -> ImportError
    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(PluginNotFoundError, match=re.escape('siirl-envs[gem]')):
        make_env("gem", {"env_id": "game:GuessTheNumber-v0-easy"}).reset(seed=0)
    with pytest.raises(PluginNotFoundError, match=re.escape('siirl-envs[textarena]')):
        make_env("textarena", {"env_id": "GuessTheNumber-v0"}).reset(seed=0)


@needs_gem
def test_an_agentic_run_plays_a_gem_game(tmp_path):
    cmd = [sys.executable, "-m", "siirl.main_dag", "algorithm.workflow_type=AGENTIC",
           "+custom_envs.Guess.env_type=gem",
           "+custom_envs.Guess.env_config.env_id=game:GuessTheNumber-v0-easy",
           "env_manager.max_actions_per_traj=3", "env_manager.env_processes=1",
           "data.max_response_length=8", "data.train_batch_size=4",
           "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
           "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path}",
           "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
           "trainer.logger=[]", "trainer.device=cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, RAY_AUTH_MODE="disabled"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:  # the built-in model misses the format: scored all the same
        assert 0.0 <= record["env/Guess/success_rate"] <= 1.0
        assert "env/Guess/score/mean" in record and "env/Guess/turns/mean" in record
        assert "actor/pg_loss" in record
