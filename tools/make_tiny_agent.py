"""Build siiRL's built-in tiny agent model (``siirl/engine/assets/tiny_agent``,
``builtin:tiny-agent``): one tiny Llama that plays FrozenLake and Sokoban, badly.

    python tools/make_tiny_agent.py          # build, warm up, save (a few minutes on a CPU)
    python tools/tiny_agent_rl_check.py      # then a short GRPO-like check on the result

It is made for the AGENTIC presets (``configs/agentic_*.yaml``): it answers in the right
format almost always and succeeds in some episodes, not most, so GRPO's group advantages
have signal from the first step.

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

Warm-up stops at the first check (every ``--eval-every`` steps) where, on held-out seeds, the
success rate of each environment is inside ``--lo``..``--hi`` sampled at temperature 1 and
inside ``--greedy-lo``..``--hi`` greedily, and at most ``--max-format-errors`` of the replies
lack an action.
Everything is seeded and runs on one CPU thread, so a re-run reproduces the same weights
(on the same torch build).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import string
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from siirl.environment import frozen_lake, sokoban
from siirl.environment.agentic.trajectory import TrajectoryEnvManager
from siirl.environment.registry import make_env

ROOT = Path(__file__).resolve().parents[1]
ASSET_DIR = ROOT / "packages/siirl-engine/src/siirl/engine/assets/tiny_agent"
COMMAND = "python tools/make_tiny_agent.py"

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
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
CHARS = sorted(set(string.printable) - set("\t\r\x0b\x0c"))


# --------------------------------------------------------------------------- tokenizer
def build_tokenizer() -> PreTrainedTokenizerFast:
    """Known words are one token; everything else one token per character."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    words = "|".join(w.replace("/", "\\/") for w in WORDS)
    core.pre_tokenizer = pre_tokenizers.Split(Regex(f"{words}|[\\s\\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(SPECIALS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        unk_token="<unk>", padding_side="left", model_max_length=MANAGER["max_episode_tokens"],
        clean_up_tokenization_spaces=False)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (
        PAD_ID, BOS_ID, EOS_ID, UNK_ID)
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
    n = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), n), PAD_ID, dtype=torch.long)
    lab = torch.full((len(rows), n), -100, dtype=torch.long)
    att = torch.zeros((len(rows), n), dtype=torch.long)
    for i, (seq, loss) in enumerate(rows):
        ids[i, :len(seq)] = torch.tensor(seq)
        att[i, :len(seq)] = 1
        lab[i, :len(seq)] = torch.tensor([t if m else -100 for t, m in zip(seq, loss,
                                                                            strict=True)])
    return ids, att, lab


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
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            att[i, width - len(p):] = 1
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


def evaluate_all(model, tok, args, lazy: bool = False) -> dict:
    """Greedy, then sampled play per environment on held-out seeds (training episodes use
    seeds from 1,000,000 on); ``lazy``: sampled only when every greedy rate is in the
    window (it decides nothing otherwise)."""
    seeds = list(range(args.eval_episodes))
    result = {f"{tag}/greedy": evaluate(model, tok, tag, seeds, False, args.seed)
              for tag in ENVS}
    if not lazy or in_window(args, result):
        result.update({f"{tag}/sampled": evaluate(model, tok, tag, seeds, True, args.seed)
                       for tag in ENVS})
    return result


def in_window(args, result: dict) -> bool:
    """Every success rate at most ``hi``; sampled ones at least ``lo``, greedy ones at least
    ``greedy_lo`` (greedy play of a half-trained policy is often a fixed walk, all or
    nothing per map); few replies without an action."""
    return all((args.greedy_lo if key.endswith("/greedy") else args.lo) <= r["success"]
               <= args.hi and r["format_errors"] <= args.max_format_errors
               for key, r in result.items())


def summary(result: dict) -> str:
    return " ".join(f"{k} {r['success']:.2f}/{r['format_errors']:.2f}" for k, r in result.items())


# ------------------------------------------------------------------------- warm-up
def warm_up(model, tok, rows, args, log) -> tuple[int, dict]:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.wd,
                            betas=(0.9, 0.98))
    warmup = 20

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        t = min(1.0, (step - warmup) / max(1, args.steps - warmup))
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    rng = random.Random(args.seed)
    order: list[int] = []
    result: dict = {}
    for step in range(1, args.steps + 1):
        model.train()
        if len(order) < args.batch_size:
            more = list(range(len(rows)))
            rng.shuffle(more)
            order += more
        batch = [rows[i] for i in order[:args.batch_size]]
        del order[:args.batch_size]
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1)
        loss = sft_loss(model, *batch_tensors(batch))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.eval_every and step != args.steps:
            continue
        result = evaluate_all(model, tok, args, lazy=args.early_stop)
        log(f"step {step:4d} loss {loss.item():.3f} success/format-errors {summary(result)}")
        if args.early_stop and len(result) == 2 * len(ENVS) and in_window(args, result):
            return step, result
    if len(result) < 2 * len(ENVS):
        result = evaluate_all(model, tok, args)
    return args.steps, result


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
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--frozenlake-episodes", type=int, default=1000)
    ap.add_argument("--sokoban-episodes", type=int, default=2000,
                    help="more than FrozenLake's: its episodes are shorter, and harder")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-episodes", type=int, default=48, help="held-out seeds per env")
    ap.add_argument("--early-stop", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--lo", type=float, default=0.10, help="sampled success, low")
    ap.add_argument("--greedy-lo", type=float, default=0.05, help="greedy success, low")
    ap.add_argument("--hi", type=float, default=0.35, help="success, high")
    ap.add_argument("--max-format-errors", type=float, default=0.05,
                    help="share of replies without an action allowed at the stop")
    args = ap.parse_args(argv)

    t0 = time.time()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.use_deterministic_algorithms(True)

    def log(msg: str) -> None:
        print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

    tok = build_tokenizer()
    model = build_model(tok, args.hidden, args.layers, args.heads, args.head_dim)
    n_params = sum(p.numel() for p in model.parameters())
    counts = {"FrozenLake": args.frozenlake_episodes, "SimpleSokoban": args.sokoban_episodes}
    rows = scripted_data(tok, counts, args.seed)
    lengths = [len(ids) for ids, _ in rows]
    log(f"vocab {len(tok)}, params {n_params:,}, {len(rows)} scripted episodes "
        f"({sum(lengths) / len(lengths):.0f} tokens mean, {max(lengths)} max)")
    steps, result = warm_up(model, tok, rows, args, log)
    ok = in_window(args, result)

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    tok_cfg_path = out / "tokenizer_config.json"  # portable class name (transformers 4 and 5)
    tok_cfg = json.loads(tok_cfg_path.read_text())
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_cfg.pop("backend", None)
    tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")
    build_s = time.time() - t0
    info = dict(command=_command(argv), params=n_params, hidden=args.hidden,
                layers=args.layers, heads=args.heads, head_dim=args.head_dim, vocab=len(tok),
                seed=args.seed, steps=steps, lr=args.lr, wd=args.wd,
                batch_size=args.batch_size, episodes=len(rows),
                counts=", ".join(f"{tag} {n}" for tag, n in counts.items()), lo=args.lo, hi=args.hi,
                greedy_lo=args.greedy_lo,
                eval_episodes=args.eval_episodes, build_s=round(build_s),
                scripted_tokens_mean=round(sum(lengths) / len(lengths)),
                scripted_tokens_max=max(lengths), result=result)
    (out / "agent_envs.json").write_text(json.dumps(
        {"custom_envs": ENVS, "env_manager": MANAGER}, indent=2) + "\n")
    write_card(out, info)
    for f in out.iterdir():
        f.chmod(0o644)  # safetensors writes 0600; the wheel must ship readable files
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log(f"saved to {out} ({size / 1024:.0f} KiB) after {steps} steps")
    print(json.dumps(info))
    if not ok:
        raise SystemExit(f"success out of [{args.lo}, {args.hi}] or too many format errors: "
                         "adjust the settings")


def write_card(out: Path, info: dict) -> None:
    rows = "\n".join(
        f"| {key.split('/')[0]} | {key.split('/')[1]} | {r['success']:.3f} | "
        f"{r['format_errors']:.3f} | {r['tokens_mean']:.0f} | {r['tokens_max']} |"
        for key, r in info["result"].items())
    envs = "\n".join(f"      {tag}:\n        env_type: {e['env_type']}\n"
                     f"        env_instruction: {e['env_instruction']}\n"
                     f"        env_config: {json.dumps(e['env_config'])}"
                     for tag, e in ENVS.items())
    shape = (f'hidden {info["hidden"]}, {info["layers"]} layers, {info["heads"]} heads of '
             f'dimension {info["head_dim"]}')
    lengths = (f'{info["scripted_tokens_mean"]} tokens on average and '
               f'{info["scripted_tokens_max"]} at most')
    stopped = f'stopped after {info["steps"]} steps'
    text = f"""# tiny_agent

`builtin:tiny-agent`: a tiny Llama ({info["params"]:,} parameters, float32) that plays
FrozenLake and Sokoban through siiRL's AGENTIC pipeline, with low but non-zero success, so
that GRPO has something to improve. It is not useful for anything else.

* Episodes as the trajectory env manager builds them without a chat template: the
  one-word instruction, a newline and the grid; then per turn the reply
  `<answer>Left</answer></s>` and `\\n` + the next grid + `\\n`.
* Tokenizer (word level): `<pad>`=0, `<s>`=1, `</s>`=2, `<unk>`=3; these words are one
  token each: {", ".join(f"`{w}`" for w in WORDS)};
  every other printable ASCII character is one token (grid symbols, digits, space,
  newline). No BOS, no chat template, left padding.
* Model: `LlamaForCausalLM`, {shape}
  (vLLM's CPU attention accepts it), intermediate {4 * info["hidden"]}, tied embeddings,
  vocab {info["vocab"]}, max positions {MANAGER["max_episode_tokens"]}.

## Settings it was trained with (use them verbatim; also in `agent_envs.json`)

    custom_envs:
{envs}
    env_manager:
      max_actions_per_traj: {MANAGER["max_actions_per_traj"]}
      max_tokens_per_step: {MANAGER["max_tokens_per_step"]}
      max_episode_tokens: {MANAGER["max_episode_tokens"]}

`env_instruction` replaces the environments' long default instructions with one word;
with the default ones the prompts are out of distribution (and much longer).

## How it was made

`tools/make_tiny_agent.py`, seed {info["seed"]}: {info["episodes"]} scripted episodes
({info["counts"]}; seeds from 1,000,000 on), played
by the environments' breadth-first solvers with random actions mixed in (per episode,
probability 0 to 0.6), {lengths}; supervised
warm-up on the agent's tokens only (a random action's word excluded), AdamW lr
{info["lr"]}, weight decay {info["wd"]}, batch {info["batch_size"]} episodes, {stopped}, at the
first check where every success rate below was in [{info["lo"]}, {info["hi"]}] sampled and
[{info["greedy_lo"]}, {info["hi"]}] greedily, with few format errors.

Held-out seeds 0..{info["eval_episodes"] - 1} per environment, at the stop (sampled: temperature 1):

| environment | decoding | success | format errors / reply | tokens mean | tokens max |
| --- | --- | --- | --- | --- | --- |
{rows}

For reference, uniformly random actions succeed in about 1% of these FrozenLake maps and
about 20% of these Sokoban puzzles (they are small), and the solvers in all of them within
8 actions (Sokoban: about 95%).

Remake it (deterministic: seeded, one CPU thread; {info["build_s"]} s here, on a shared
2-core machine):

    {info["command"]}
"""
    (out / "README.md").write_text(text)


def _command(argv) -> str:
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join([COMMAND, *map(shlex.quote, args)])


if __name__ == "__main__":
    main()
