"""siiRL's own example files load unchanged: its multi-turn tool and interaction configs
(``siirl.execution.rollout_flow.multiturn...``, GSM8K's tool and simulated user, driven by
the tool loop with per-conversation instances) and the reward-score modules its MARFT
environments import (``siirl.utils.reward_score.math`` / ``.prime_code``)."""

import asyncio
import importlib.util
import json
from pathlib import Path

from test_multi_turn import encoded
from test_trajectory_manager import char_tokenizer

from siirl.environment.multi_turn import ToolLoop
from siirl.environment.multi_turn.interactions import load_interactions
from siirl.environment.tools import load_tools

EXAMPLES = Path(__file__).resolve().parents[1] / "e2e/data/siirl_examples/examples"
TOOLS = EXAMPLES / "multi_turn/config/tool_config/gsm8k_tool_config.yaml"
INTERACTIONS = EXAMPLES / "multi_turn/config/interaction_config/gsm8k_interaction_config.yaml"
MARFT = EXAMPLES / "experimental/marft/config"


def _call(answer):
    call = {"name": "calc_gsm8k_reward", "arguments": {"answer": str(answer)}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def test_the_gsm8k_tool_grades_each_conversations_answers_against_its_own_truth():
    tools = load_tools(str(TOOLS))
    assert [s["function"]["name"] for s in tools.schemas] == ["calc_gsm8k_reward"]
    tokenizer = char_tokenizer(True)
    loop = ToolLoop(tokenizer, tools, budget=4000, max_assistant_turns=3)
    rows = [{"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": t}}}}
            for t in ("72", "10")]
    conversations = [loop.start([5, 6], [], None, tools.instances(extra)) for extra in rows]
    script = {0: iter([_call(70), _call(72), "done"]), 1: iter([_call(10), _call(10), "x"])}
    active = lambda: [i for i, c in enumerate(conversations) if not c.done]  # noqa: E731
    loop.run(conversations, lambda prompts, room: [encoded(tokenizer, next(script[i]))
                                                   for i in active()])
    told = [tokenizer.decode([t for t, m in zip(c.response_ids, c.mask, strict=True) if not m])
            for c in conversations]
    assert "answer='70' reward=0.0" in told[0] and "answer='72' reward=1.0" in told[0]
    assert told[1].count("reward=1.0") == 2
    # the tool's step rewards: no gain is penalised, a better answer is not
    assert conversations[0].tool_instances.rewards == [-0.05, 0.0]
    assert conversations[1].tool_instances.rewards == [0.0, -0.05]
    for conversation in conversations:
        conversation.tool_instances.close()
    assert not next(iter(tools.tools.values()))._answers.states  # all released


def test_the_gsm8k_interaction_ends_a_conversation_on_the_right_answer():
    interactions = load_interactions(str(INTERACTIONS))
    tokenizer = char_tokenizer(True)
    loop = ToolLoop(tokenizer, load_tools(None), budget=4000, max_user_turns=5)
    session = interactions.session({"interaction_kwargs": {"name": "gsm8k",
                                                           "ground_truth": "72"}})
    conversation = loop.start([5, 6], [{"role": "user", "content": "How many?"}], session)
    replies = iter(["It is 70.", "I think 72."])
    loop.run([conversation], lambda prompts, room: [encoded(tokenizer, next(replies))])
    assert conversation.turn_scores == [0.0, 1.0] and conversation.user_turns == 2
    told = tokenizer.decode([t for t, m in zip(conversation.response_ids, conversation.mask,
                                               strict=True) if not m])
    assert "incorrect" in told


def _module(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_siirls_marft_environments_import_and_score():
    math_env = _module(MARFT / "math_env.py").MathEnv()
    obs, score, done = asyncio.run(math_env.step(["r", "so \\boxed{\\frac12}"], "\\frac{1}{2}"))
    assert (score, done) == (1.0, True) and obs[1].endswith("This answer is right.")
    assert asyncio.run(math_env.step(["r", "\\boxed{3}"], "4"))[1:] == (0.0, False)
    code_env = _module(MARFT / "code_env.py").CodeEnv()
    cases = {"inputs": ["2\n", "5\n"], "outputs": ["4\n", "25\n"]}
    right = "```python\nn = int(input())\nprint(n * n)\n```"
    assert asyncio.run(code_env.step(["r", right], cases))[1:] == (1.0, True)
    assert asyncio.run(code_env.step(["r", "print(4)"], cases))[1:] == (0.0, False)


def test_prime_code_runs_function_cases_and_counts_passes_when_continuous():
    from siirl.utils.reward_score.prime_code import compute_score

    program = "def add(a, b):\n    return a + b\n"
    assert compute_score(program, {"fn_name": "add", "inputs": [[1, 2], [3, 4]],
                                   "outputs": [3, 7]})[0] is True
    passed, metadata = compute_score("print(1)", '{"inputs": ["", ""], "outputs": ["1", "2"]}',
                                     continuous=True)
    assert passed == 0.5 and [m["passed"] for m in metadata] == [True, False]
    assert compute_score("while True: pass", {"inputs": [""], "outputs": ["1"]})[1][0]["why"] \
        == "timeout"
