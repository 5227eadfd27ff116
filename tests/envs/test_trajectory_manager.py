"""The trajectory-level env manager: whole episodes as one token list, agent tokens masked
in and environment tokens masked out, with format and failure handling."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from siirl.environment import make_env, sokoban
from siirl.environment.agentic import TrajectoryEnvManager
from siirl.environment.base import TextEnv

CHAT = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")


def char_tokenizer(chat: bool) -> PreTrainedTokenizerFast:
    """One token per printable character (a real fast tokenizer, no download)."""
    chars = [chr(c) for c in range(32, 127)] + ["\n", "√"]
    vocab = {"</s>": 0, "<unk>": 1, **{ch: i + 2 for i, ch in enumerate(chars)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="</s>",
                                        unk_token="<unk>", pad_token="</s>")
    tokenizer.chat_template = CHAT if chat else None
    return tokenizer


def scripted(tokenizer, replies_by_episode):
    """A policy replying from per-episode scripts, keyed by each episode's first prompt."""
    turn = {}

    def policy(prompts):
        out = []
        for ids in prompts:
            key = next(k for k in replies_by_episode if tuple(ids[:len(k)]) == k)
            script = replies_by_episode[key]
            index = turn.get(key, 0)
            turn[key] = index + 1
            out.append(tokenizer.encode(script[index], add_special_tokens=False)
                       + [tokenizer.eos_token_id])
        return out
    return policy


@pytest.mark.parametrize("chat", [False, True])
def test_a_solved_sokoban_episode_masks_exactly_the_agent_tokens(chat):
    tokenizer = char_tokenizer(chat)
    manager = TrajectoryEnvManager(tokenizer, max_actions_per_traj=20, max_episode_tokens=4096)
    env = make_env("sokoban", {"dim_room": (6, 6), "num_boxes": 1})
    episode = manager.start(env, seed=3, group="g0")
    plan = sokoban.solve(env)
    replies = [f"I move. <answer>{action}</answer>" for action in plan]
    manager.run([episode], scripted(tokenizer, {tuple(episode.ids): replies}))
    assert episode.done and episode.success and episode.turns == len(plan)
    assert episode.reward == pytest.approx(sokoban.SOLVED - 0.1 * len(plan) + 1.0)
    response, mask = episode.response_ids, episode.mask
    assert len(response) == len(mask)
    agent = tokenizer.decode([t for t, m in zip(response, mask, strict=True) if m],
                             skip_special_tokens=True)
    assert agent == "".join(replies)  # every agent token, nothing else
    environment = tokenizer.decode([t for t, m in zip(response, mask, strict=True) if not m],
                                   skip_special_tokens=True)
    assert "#" in environment and "<answer>" not in environment
    if chat:
        assert "<user>" in environment and environment.rstrip().endswith("<assistant>")


class Exploding(TextEnv):
    def reset(self, seed=None):
        return "go"

    def step(self, action):
        raise RuntimeError("simulator crashed")


def test_format_errors_cost_a_penalty_and_failures_end_the_episode(capsys):
    tokenizer = char_tokenizer(False)
    manager = TrajectoryEnvManager(tokenizer, max_actions_per_traj=3, format_penalty=-0.5,
                                   error_penalty=-2.0)
    lost = manager.start(make_env("sokoban"), seed=1, group="a")
    broken = [manager.start(Exploding(), seed=s, group="b") for s in range(2)]
    scripts = {tuple(lost.ids): ["no idea"] * 3,
               tuple(broken[0].ids): ["<answer>x</answer>"] * 2}  # same prompt
    manager.run([lost, *broken], scripted(tokenizer, scripts))
    assert lost.done and lost.turns == 3 and lost.format_errors == 3
    assert lost.reward == pytest.approx(-1.5)
    assert all(e.done and e.error == "step" and e.reward == -2.0 for e in broken)
    metrics = manager.metrics([lost, *broken])
    assert metrics["env/errors/step"] == 2 and metrics["env/format_errors"] == 3
    assert metrics["env/success_rate"] == 0.0
    err = capsys.readouterr().err
    assert err.count("simulator crashed") == 1  # warned once, then counted


def test_the_token_budget_ends_an_episode():
    tokenizer = char_tokenizer(False)
    manager = TrajectoryEnvManager(tokenizer, max_actions_per_traj=50)
    episode = manager.start(make_env("sokoban"), seed=2, group="a")
    manager.max_tokens = budget = episode.prompt_length + 120  # room for about two turns
    script = {tuple(episode.ids[:episode.prompt_length]): ["<answer>Up</answer>"] * 50}
    manager.run([episode], scripted(tokenizer, script))
    assert episode.done and len(episode.ids) < budget and 1 <= episode.turns < 5
