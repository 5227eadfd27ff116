"""The built-in text environments: seeded episodes, scripted solvers that win, the rules
of each game, and the registry's errors."""

import pytest

from siirl.environment import TextEnv, make_env, sokoban, tool_math
from siirl.errors import ConfigError, PluginNotFoundError


def play(env: TextEnv, actions):
    total, info, done = 0.0, {}, False
    for action in actions:
        assert not done, "the episode ended before the solution did"
        _, reward, done, info = env.step(action)
        total += reward
    return total, done, info


@pytest.mark.parametrize("dim, boxes", [((6, 6), 1), ((7, 7), 2)])
def test_sokoban_puzzles_are_seeded_and_solvable(dim, boxes):
    env = make_env("sokoban", {"dim_room": dim, "num_boxes": boxes})
    for seed in range(20):
        first = env.reset(seed)
        assert env.reset(seed) == first  # the same seed, the same puzzle
        assert first.count("X") + first.count("*") == boxes and not env.solved()
        plan = sokoban.solve(env)
        assert plan, f"seed {seed} has no solution:\n{first}"
        total, done, info = play(env, plan)
        assert done and info["success"] and env.solved()
        assert total >= sokoban.SOLVED - 0.1 * len(plan)
    assert len({env.reset(seed) for seed in range(20)}) > 10  # seeds differ


def test_sokoban_rules():
    env = sokoban.Sokoban(dim_room=(5, 6), num_boxes=1)
    env.reset(0)
    # a hand-made room: player, box, target in a row
    env.walls = frozenset((r, c) for r in range(5) for c in range(6)
                          if r in (0, 4) or c in (0, 5))
    env.player, env.boxes, env.targets = (2, 1), {(2, 2)}, frozenset({(2, 4)})
    assert env.render().splitlines()[2] == "#PX_O#"
    _, reward, done, info = env.step("Right")
    assert env.render().splitlines()[2] == "#_PXO#" and reward == pytest.approx(-0.1)
    _, reward, done, info = env.step("right")
    assert env.render().splitlines()[2] == "#__P*#" and done and info["success"]
    assert reward == pytest.approx(-0.1 + 1 + 10)
    env.player, env.boxes = (2, 3), {(2, 4)}
    env.step("Right")  # the box is against the wall: nothing moves
    assert env.player == (2, 3)
    _, reward, _, info = env.step("jump")
    assert not info["action_is_valid"] and reward == pytest.approx(-0.1)


def test_frozen_lake_through_gymnasium():
    pytest.importorskip("gymnasium")
    from siirl.environment import frozen_lake

    env = make_env("frozen_lake", {"size": 4})
    wins = 0
    for seed in range(10):
        first = env.reset(seed)
        assert env.reset(seed) == first and first.count("P") == 1 and "G" in first
        plan = frozen_lake.solve(env)
        assert plan is not None
        _, done, info = play(env, plan)
        wins += info["success"] and done
    assert wins == 10
    env.reset(3)
    hole = [(r, c) for r, line in enumerate(env.desc) for c, ch in enumerate(line)
            if ch == "H"]
    _, reward, _, info = env.step("sideways")
    assert not info["action_is_valid"] and reward == 0.0
    env.close()
    assert hole is not None



def test_frozen_lake_progress_reward_scores_every_move():
    pytest.importorskip("gymnasium")
    from siirl.environment import frozen_lake

    env = make_env("frozen_lake", {"size": 4, "progress_reward": 0.1})
    for seed in range(10):
        env.reset(seed)
        plan = frozen_lake.solve(env)
        rewards = [env.step(move)[1] for move in plan]
        # each move on the shortest path shortens it by one; the goal pays 1 on top
        assert rewards == pytest.approx([0.1] * (len(plan) - 1) + [1.1])
        env.reset(seed)
        first = plan[0]
        back = {"Left": "Right", "Right": "Left", "Up": "Down", "Down": "Up"}[first]
        assert env.step(first)[1] == pytest.approx(0.1)
        assert env.step(back)[1] == pytest.approx(-0.1)  # back where it started
    env.reset(0)
    assert env.step("Up")[1] == 0.0  # into the edge: nothing moves
    env.close()
    with pytest.raises(ConfigError, match="progress_reward needs is_slippery=false"):
        make_env("frozen_lake", {"progress_reward": 0.1, "is_slippery": True})

def test_tool_math_calculator_answers_and_errors():
    env = make_env("tool_math", {"operands": 3})
    question = env.reset(5)
    assert question.startswith("What is ") and env.reset(5) == question
    replies = tool_math.solve(env)
    actions = [env.parse_action(reply) for reply in replies]
    assert actions[0].startswith("calculator: ") and actions[1] == f"answer: {env.answer}"
    observation, reward, done, _ = env.step(actions[0])
    assert observation.endswith(f"= {env.answer}") and reward == 0 and not done
    _, reward, done, info = env.step(actions[1])
    assert reward == 1.0 and done and info["success"] and info["tool_calls"] == 1
    env.reset(5)
    observation, _, done, _ = env.step("calculator: __import__('os').system('true')")
    assert observation.startswith("calculator error") and not done  # the tool's error text
    assert env.step("calculator: 1/0")[0] == "calculator error: division by zero"
    assert env.step("calculator: 9**999")[0].startswith("calculator error")
    _, reward, done, info = env.step(f"answer: {env.answer + 1}")
    assert reward == 0.0 and done and not info["success"]
    assert env.parse_action("no tags here") is None
    assert env.parse_action("<tool>search: x</tool>") is None


def test_tool_math_limits_calls():
    env = tool_math.ToolMath(max_tool_calls=1)
    env.reset(0)
    env.step("calculator: 1+1")
    assert "no more calls" in env.step("calculator: 2+2")[0]


def test_default_answer_parsing():
    env = sokoban.Sokoban()
    assert env.parse_action("think... <answer> Left </answer>") == "Left"
    assert env.parse_action("<answer>Up</answer> then <answer>Down</answer>") == "Down"
    assert env.parse_action("Left") is None


def test_registry_errors_name_what_is_wrong():
    with pytest.raises(PluginNotFoundError, match="no plugin named 'sokobam'.*sokoban"):
        make_env("sokobam")
    with pytest.raises(ConfigError, match="no setting 'boxes'.*num_boxes"):
        make_env("sokoban", {"boxes": 2})
    with pytest.raises(ConfigError, match="dim_room"):
        make_env("sokoban", {"dim_room": [3, 3]})


def test_sokoban_progress_reward_scores_every_move():
    env = make_env("sokoban", {"dim_room": [6, 6], "search_depth": 100, "progress_reward": 0.1})
    plain = make_env("sokoban", {"dim_room": [6, 6], "search_depth": 100})
    for seed in range(5):
        env.reset(seed)
        plain.reset(seed)
        plan = sokoban.solve(env)
        shaped = [env.step(move)[1] for move in plan]
        base = [plain.step(move)[1] for move in plan]
        # each move of a shortest solution shortens what is left by one
        assert shaped == pytest.approx([b + 0.1 for b in base])
