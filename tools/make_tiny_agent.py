"""Build siiRL's built-in tiny agent model (``siirl/engine/assets/tiny_agent``,
``builtin:tiny-agent``): one tiny Llama that plays FrozenLake and Sokoban, badly.

    python tools/make_tiny_agent.py          # build, warm up, save (~40 min on one CPU core)
    python tools/tiny_agent_rl_check.py      # then a short GRPO-like check on the result

It is the starting model of the AGENTIC presets (``configs/agentic_*.yaml``) as it comes out
of its supervised warm-up: nothing weakens it afterwards, and the presets train it on
variants of these tasks that it was never taught (its card has its greedy and sampled
scores on the taught ones).

* Episodes are the real ones: ``TrajectoryEnvManager`` builds every training sequence
  exactly as the AGENTIC rollout node does (no chat template: the instruction line and the
  first grid, then per turn the agent's reply ``<answer>Left</answer></s>`` and the next grid
  between newlines). The instructions are one word (``ENVS[...]["env_instruction"]``), so
  prompts stay short; ``agent_envs.json`` next to the weights records the environment
  settings and instructions the model was trained with, for presets to use verbatim.
* Actions come from a scripted policy: the environments' breadth-first ``solve`` on the
  current state, replaced by a random action with a per-episode probability (0 to 0.6), so
  the model sees off-path states too. The loss is on the agent's tokens only (mask 1), and
  on a random action's word not at all (its tags and EOS still are): the model imitates
  the solver from whatever state it is in.
* Tokenizer (``tokenizers`` word level): the action words, ``<answer>``/``</answer>``, the
  instruction words and ``Invalid``/``format`` are one token each; any other ASCII
  character is one token (grid symbols, digits, newline, space), so any ASCII text
  round-trips. ``<pad>``=0, ``<s>``=1, ``</s>``=2, ``<unk>``=3; no BOS, no chat template, left
  padding.

* The warm-up runs its whole cosine schedule (``--steps``); the model is saved as it ends.

The build fails unless, on held-out seeds, each environment's greedy success is at least
``--greedy-lo`` (it learned to read the grid) and at most ``--max-format-errors`` of the
replies lack an action.
Everything is seeded and runs on one CPU thread, so a re-run reproduces the same weights
(on the same torch build).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tiny_agent_card import card_text
from tiny_build import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    PRINTABLE,
    SPECIALS,
    Shuffled,
    adamw,
    command_line,
    finish,
    left_padded,
    optimiser_step,
    python_permutation,
    right_padded,
    save_tokenizer,
    seeded,
    timed_log,
    warmup_cosine,
    word_tokenizer,
)
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from siirl.environment import frozen_lake, sokoban
from siirl.environment.agentic.trajectory import TrajectoryEnvManager
from siirl.environment.registry import make_env

ROOT = Path(__file__).resolve().parents[1]
ASSET_DIR = ROOT / "packages/siirl-engine/src/siirl/engine/assets/tiny_agent"

ACTIONS = ["Left", "Down", "Right", "Up"]
# the settings the model is trained with (custom_envs entries, ROLL-style); tag -> entry
ENVS = {
    "FrozenLake": {"env_type": "frozen_lake", "env_instruction": "frozenlake",
                   "env_config": {"size": 4, "p": 0.8, "is_slippery": False}},
    "SimpleSokoban": {"env_type": "sokoban", "env_instruction": "sokoban",
                      "env_config": {"dim_room": [6, 6], "num_boxes": 1,
                                     "search_depth": 100}},
}
SOLVERS = {"frozen_lake": frozen_lake.solve, "sokoban": sokoban.solve}
MANAGER = {"max_actions_per_traj": 8, "max_tokens_per_step": 8, "max_episode_tokens": 512}
WORDS = ["<answer>", "</answer>", *ACTIONS, "Invalid", "format",
         *sorted({e["env_instruction"] for e in ENVS.values()})]


# --------------------------------------------------------------------------- tokenizer
def build_tokenizer():
    """Known words are one token; everything else one token per character."""
    tok = word_tokenizer(SPECIALS + WORDS + PRINTABLE, WORDS, MANAGER["max_episode_tokens"])
    assert tok.convert_ids_to_tokens(tok.encode("<answer>Left</answer>")) == [
        "<answer>", "Left", "</answer>"]
    return tok


def build_model(tok, hidden: int, layers: int, heads: int, head_dim: int) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        head_dim=head_dim, max_position_embeddings=MANAGER["max_episode_tokens"],
        rms_norm_eps=1e-5, tie_word_embeddings=True, initializer_range=0.02,
        pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    return LlamaForCausalLM(cfg)


def make(tag: str):
    entry = ENVS[tag]
    env = make_env(entry["env_type"], entry["env_config"])
    env.instructions = entry["env_instruction"]
    return env


def new_manager(tok) -> TrajectoryEnvManager:
    return TrajectoryEnvManager(tok, MANAGER["max_actions_per_traj"],
                                MANAGER["max_episode_tokens"])


# ---------------------------------------------------------------------- scripted data
def scripted_episode(tok, manager, env, tag: str, seed: int, noise: float,
                     rng: random.Random):
    """One episode played by the solver with random actions mixed in: ``(ids, loss_mask)``
    over the whole sequence (prompt included, where the loss mask is 0)."""
    solve = SOLVERS[ENVS[tag]["env_type"]]
    episode = manager.start(env, seed, group=str(seed), tag=tag)
    trained: list[bool] = []  # per turn: is the action word the solver's

    def policy(prompts):
        plan = solve(env)
        if plan and rng.random() >= noise:
            action, expert = plan[0], True
        else:
            action, expert = rng.choice(ACTIONS), False
        trained.append(expert)
        return [tok.encode(f"<answer>{action}</answer>") + [EOS_ID] for _ in prompts]

    manager.run([episode], policy)
    loss = [0] * episode.prompt_length + list(episode.mask)
    for (start, _end), expert in zip(episode.turn_spans, trained, strict=True):
        if not expert:
            loss[start + 1] = 0  # the action word after <answer>
    return episode.ids, loss


def scripted_data(tok, counts: dict, seed: int) -> list[tuple[list[int], list[int]]]:
    """``counts[tag]`` scripted episodes per environment."""
    rng = random.Random(seed)
    manager = new_manager(tok)
    rows = []
    for tag in ENVS:
        env = make(tag)  # reset() starts each episode afresh
        for i in range(counts[tag]):
            noise = rng.choice([0.0, 0.15, 0.3, 0.45, 0.6])
            rows.append(scripted_episode(tok, manager, env, tag,
                                         1_000_000 + seed * 100_000 + i, noise, rng))
        env.close()
    return rows


def batch_tensors(rows):
    """``(ids, attention_mask, labels)`` of ``(ids, loss_mask)`` rows, right-padded."""
    return right_padded([seq for seq, _ in rows],
                        [[t if m else -100 for t, m in zip(seq, loss, strict=True)]
                         for seq, loss in rows])


def sft_loss(model, ids, att, lab) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
    return F.cross_entropy(logits.transpose(1, 2), lab[:, 1:], ignore_index=-100)


# -------------------------------------------------------------------------- evaluation
class ModelPolicy:
    """One reply per prompt from ``model.generate`` (left padding, stop at EOS)."""

    def __init__(self, model, sample: bool, max_new: int = MANAGER["max_tokens_per_step"]):
        self.model, self.sample, self.max_new = model, sample, max_new
        self.replies = 0

    @torch.no_grad()
    def __call__(self, prompts):
        ids, att, _ = left_padded(prompts)
        width = ids.shape[1]
        kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if self.sample \
            else dict(do_sample=False)
        out = self.model.generate(input_ids=ids, attention_mask=att, max_new_tokens=self.max_new,
                                  pad_token_id=PAD_ID, eos_token_id=EOS_ID, **kwargs)
        self.replies += len(prompts)
        replies = []
        for row in out[:, width:].tolist():
            reply = []
            for t in row:
                reply.append(t)
                if t == EOS_ID:
                    break
            replies.append(reply)
        return replies


def evaluate(model, tok, tag: str, seeds, sample: bool, seed: int = 0) -> dict:
    """Success rate, format-error rate per reply and episode lengths on ``seeds``."""
    model.eval()
    torch.manual_seed(seed)
    manager = new_manager(tok)
    episodes = [manager.start(make(tag), s, group=str(s), tag=tag) for s in seeds]
    policy = ModelPolicy(model, sample)
    manager.run(episodes, policy)
    for e in episodes:
        e.env.close()
    lengths = [len(e.ids) for e in episodes]
    return {"success": sum(e.success for e in episodes) / len(episodes),
            "format_errors": sum(e.format_errors for e in episodes) / max(1, policy.replies),
            "tokens_mean": sum(lengths) / len(lengths), "tokens_max": max(lengths)}


def evaluate_all(model, tok, args) -> dict:
    """Greedy, then sampled play per environment on held-out seeds (training episodes use
    seeds from 1,000,000 on)."""
    seeds = list(range(args.eval_episodes))
    return {f"{tag}/{mode}": evaluate(model, tok, tag, seeds, mode == "sampled", args.seed)
            for mode in ("greedy", "sampled") for tag in ENVS}


def learned(args, result: dict) -> bool:
    """Greedy success at least ``greedy_lo`` (the model reads the grid); few replies without
    an action, greedy or sampled."""
    return all((args.greedy_lo <= r["success"] or not key.endswith("/greedy"))
               and r["format_errors"] <= args.max_format_errors for key, r in result.items())


def summary(result: dict) -> str:
    return " ".join(f"{k} {r['success']:.2f}/{r['format_errors']:.2f}" for k, r in result.items())


# ------------------------------------------------------------------------- warm-up
def warm_up(model, tok, rows, args, log) -> dict:
    """Supervised warm-up; returns the last check's result (the last step is checked)."""
    opt = adamw(model.parameters(), args.lr, args.wd)
    lr_at = warmup_cosine(args.lr, args.steps, warmup=20, floor=0.1)
    order = Shuffled(len(rows), args.batch_size, python_permutation(random.Random(args.seed)))
    for step in range(1, args.steps + 1):
        model.train()
        batch = [rows[i] for i in order.next()]
        loss = sft_loss(model, *batch_tensors(batch))
        optimiser_step(opt, loss, lr_at(step - 1), clip=model.parameters())
        if step % args.eval_every == 0 or step == args.steps:
            result = evaluate_all(model, tok, args)
            log(f"step {step:4d} loss {loss.item():.3f} success/format-errors {summary(result)}")
    return result


# -------------------------------------------------------------------------------- main
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ASSET_DIR)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=32,
                    help="attention head dimension (vLLM's CPU attention needs >= 32)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--frozenlake-episodes", type=int, default=1000)
    ap.add_argument("--sokoban-episodes", type=int, default=6000,
                    help="more than FrozenLake's: its episodes are shorter, and harder")
    ap.add_argument("--eval-every", type=int, default=600)
    ap.add_argument("--eval-episodes", type=int, default=200, help="held-out seeds per env")
    ap.add_argument("--greedy-lo", type=float, default=0.25, help="greedy success, low")
    ap.add_argument("--max-format-errors", type=float, default=0.05,
                    help="share of replies without an action allowed at the stop")
    args = ap.parse_args(argv)

    log = timed_log()
    seeded(args.seed, python_random=True)
    tok = build_tokenizer()
    model = build_model(tok, args.hidden, args.layers, args.heads, args.head_dim)
    n_params = sum(p.numel() for p in model.parameters())
    counts = {"FrozenLake": args.frozenlake_episodes, "SimpleSokoban": args.sokoban_episodes}
    rows = scripted_data(tok, counts, args.seed)
    lengths = [len(ids) for ids, _ in rows]
    log(f"vocab {len(tok)}, params {n_params:,}, {len(rows)} scripted episodes "
        f"({sum(lengths) / len(lengths):.0f} tokens mean, {max(lengths)} max)")
    result = warm_up(model, tok, rows, args, log)
    ok = learned(args, result)

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    model.save_pretrained(out)
    save_tokenizer(tok, out)
    build_s = time.time() - log.t0
    info = dict(command=command_line("make_tiny_agent.py", argv), params=n_params,
                hidden=args.hidden, layers=args.layers, heads=args.heads,
                head_dim=args.head_dim, vocab=len(tok),
                seed=args.seed, steps=args.steps, lr=args.lr, wd=args.wd,
                batch_size=args.batch_size, episodes=len(rows),
                counts=", ".join(f"{tag} {n}" for tag, n in counts.items()),
                greedy_lo=args.greedy_lo, eval_episodes=args.eval_episodes,
                build_s=round(build_s), scripted_tokens_mean=round(sum(lengths) / len(lengths)),
                scripted_tokens_max=max(lengths), result=result)
    (out / "agent_envs.json").write_text(json.dumps(
        {"custom_envs": ENVS, "env_manager": MANAGER}, indent=2) + "\n")
    finish(out, card_text(info, ENVS, WORDS, MANAGER), log,
           note=f" after {args.steps} steps")
    print(json.dumps(info))
    if not ok:
        raise SystemExit(f"greedy success under {args.greedy_lo} or too many format errors: "
                         "the warm-up did not learn the tasks")


if __name__ == "__main__":
    main()
