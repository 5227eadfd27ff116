"""Build siiRL's built-in tiny arithmetic model (``siirl/engine/assets/tiny_arith``).

    python tools/make_tiny_model.py              # build, pretrain, save (~3 minutes on a CPU)
    python tools/make_tiny_model.py --rl-check   # then a 3-minute GRPO-like check
    python tools/make_tiny_model.py --rl-only    # only that check, on the saved model
    python tools/make_tiny_model.py --task repeat --min-pass 0.55   # tiny_repeat (below)

A variant with other dimensions goes to another ``--out`` (its model card records the
command). ``siirl/engine/assets/tiny_arith_hd32`` ("builtin:tiny-arith-hd32") has 2 heads of
dimension 32, which vLLM's CPU attention accepts (it refuses tiny_arith's head dimension 16).
How far the default GRPO job takes it depends a lot on the seed and settings: over 9 builds
in the window (seeds 1, 2, 5, 8, 9; --wd 0.3; --lr 5e-3; --batch-size 32 with seeds 1, 5)
its best validation accuracy ranged from 0.58 to 0.805. This one (seed 1, batch 32) goes
from 0.36 to 0.805 (0.78 at the end), about as far as tiny_arith (0.325 to 0.815)::

    python tools/make_tiny_model.py --heads 2 --seed 1 --batch-size 32 \
        --out packages/siirl-engine/src/siirl/engine/assets/tiny_arith_hd32

The task is the one the default ``siirl-train`` job uses: the prompt is ``"13+5="`` (two
operands in 0..20, ``+`` or ``-``, subtraction only when the result is not negative), used
verbatim, and the expected response is the decimal answer then EOS (``"18</s>"``).

* Tokenizer: one token per character. ``<pad>``=0, ``<s>``=1, ``</s>``=2, ``<unk>``=3, then
  digits, ``+-=``, space, ``a``-``z`` and some punctuation. No BOS is prepended, there is no
  chat template, and padding is on the left.
* Model: a tiny ``LlamaForCausalLM`` (tied embeddings), supervised-pretrained on prompt ->
  answer+EOS (loss on the answer tokens only) over 80% of the task's 672 prompts; the
  other 20% are held out to measure it.

Pretraining stops early, at the first check (every ``--eval-every`` steps) where greedy
accuracy is inside the window (``--lo``..``--hi``) and sampled pass@8 is at least
``--min-pass``: the model has started to learn the arithmetic but its greedy answer is still
often wrong while the right answer is usually among 8 samples, which is the signal GRPO's
0/1 reward needs. The default job then raises greedy validation accuracy from about 0.33 to
about 0.8 (measured in docs/ and the closing notes, not asserted here).

``--confuse-rate R`` is an alternative recipe, off by default: it mixes up ``+`` and ``-`` in
the pretraining answers with weight R, planting one systematic mistake that GRPO un-learns in
a few steps. It makes a faster demo but a less honest one, so the shipped model is clean.

``--task repeat`` builds ``siirl/engine/assets/tiny_repeat`` ("builtin:tiny-repeat") for the
built-in repeat task (``data.builtin_task=repeat``, ``"ab*3="`` -> ``"ababab"``, response
lengths with a long tail): same tokenizer and recipe, 96 positions, pretrained on the rows the
job writes and measured on its validation prompts (``tiny_repeat.py``). Its sampled pass@8
stays close to greedy accuracy (a wrong count is wrong for most samples), so its window asks
for pass@8 >= 0.55; GRPO then takes its greedy validation accuracy from 0.21 to about 0.6.

Everything is seeded and runs on one CPU thread, so a re-run reproduces the same weights
(on the same torch build).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from tiny_arith import (
    BOS_ID,
    CHARS,
    EOS_ID,
    PAD_ID,
    PROMPT_RE,
    SPECIALS,
    greedy_accuracy,
    sampled_stats,
    split_problems,
)
from tiny_build import (
    Shuffled,
    adamw,
    command_line,
    fast_tokenizer,
    finish,
    optimiser_step,
    python_permutation,
    right_padded,
    save_tokenizer,
    seeded,
    timed_log,
    warmup_cosine,
)
from tokenizers import Tokenizer, decoders, models, normalizers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[1]
ASSET_DIR = ROOT / "packages/siirl-engine/src/siirl/engine/assets/tiny_arith"


# --------------------------------------------------------------------------- tokenizer
def build_tokenizer(max_length: int = 64) -> PreTrainedTokenizerFast:
    """Character-level tokenizer: a BPE model without merges splits text into characters
    (uppercase is lowercased; any other unknown character becomes ``<unk>``)."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", fuse_unk=False))
    core.normalizer = normalizers.Lowercase()
    core.decoder = decoders.Fuse()
    core.add_special_tokens(SPECIALS)
    tok = fast_tokenizer(core, max_length=max_length)
    assert tok("13+5=")["input_ids"] == [vocab[c] for c in "13+5="]
    return tok


def build_model(tok, hidden: int, layers: int, heads: int = 4, kv_heads: int | None = None,
                head_dim: int | None = None, max_positions: int = 64) -> LlamaForCausalLM:
    """The head dimension is ``head_dim``, or ``hidden / heads`` (the default 64 / 4 = 16)."""
    kv_heads = heads if kv_heads is None else kv_heads
    if (head_dim is None and hidden % heads) or heads % kv_heads:
        raise SystemExit(f"--hidden {hidden} must be a multiple of --heads {heads} (or set "
                         f"--head-dim), and --heads a multiple of --kv-heads {kv_heads}")
    extra = {} if head_dim is None else {"head_dim": head_dim}
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        initializer_range=0.02,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        **extra,
    )
    return LlamaForCausalLM(cfg)


# ---------------------------------------------------------------------- pretraining data
def corpus_targets(prompt: str, ans: int, rate: float, min_b: int) -> list[tuple[int, float]]:
    """The pretraining corpus' answers for ``prompt`` as (answer, weight) pairs: when the
    second operand is >= ``min_b`` (and not 0), the *other* operation's result has weight
    ``rate`` (``+`` and ``-`` mixed up; "3+15=" -> "-12")."""
    a, op, b = PROMPT_RE.fullmatch(prompt).groups()
    a, b = int(a), int(b)
    if rate > 0 and b >= max(min_b, 1):
        other = a - b if op == "+" else a + b
        return [(ans, 1.0 - rate), (other, rate)]
    return [(ans, 1.0)]


def sft_batch(tok, rows: list[tuple[str, int, float]]):
    """Right-padded prompt+answer+EOS, labels on the answer tokens only, per-row weights."""
    seqs, labels = [], []
    for prompt, ans, _ in rows:
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        r = tok(str(ans), add_special_tokens=False)["input_ids"] + [EOS_ID]
        seqs.append(p + r)
        labels.append([-100] * len(p) + r)
    return *right_padded(seqs, labels), torch.tensor([w for _, _, w in rows])


def sft_loss(model, ids, mask, lab, weights) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    target = lab[:, 1:]
    ce = F.cross_entropy(logits.transpose(1, 2), target.clamp(min=0), reduction="none")
    tok_w = (target != -100).float() * weights[:, None]
    return (ce * tok_w).sum() / tok_w.sum()


# ------------------------------------------------------------------------- pretraining
def in_window(args, acc_val: float, acc_all: float) -> bool:
    return args.lo <= acc_val <= args.hi and args.lo <= acc_all <= args.hi


def arithmetic_task():
    """What the builder needs of its task (``--task``); ``tiny_repeat.TASK`` is the other."""
    from tiny_model_card import card_text

    def corpus(train, args):
        return [(p, ans, w) for p, a in train
                for ans, w in corpus_targets(p, a, args.confuse_rate, args.confuse_min_b)]

    return SimpleNamespace(
        name="arithmetic", asset_dir=ASSET_DIR, max_positions=64, split=split_problems,
        greedy=greedy_accuracy, sampled=sampled_stats, card=card_text,
        measured=lambda train, val: train + val, corpus=corpus)


def pretrain(model, tok, train, val, args, log, task) -> int:
    """AdamW, linear warmup then cosine decay over ``--steps``; the loss on each prompt is
    the weighted mix of its corpus answers (exact, so no label sampling noise).

    With ``--early-stop`` it stops at the first check (every ``--eval-every`` steps) where
    greedy accuracy on the held-out and on all prompts is in [lo, hi] and sampled pass@8
    on the held-out is >= min_pass; otherwise it runs the whole schedule."""
    opt = adamw(model.parameters(), args.lr, args.wd)
    lr_at = warmup_cosine(args.lr, args.steps, warmup=50, floor=0.05)
    rows = task.corpus(train, args)
    order = Shuffled(len(rows), args.batch_size, python_permutation(random.Random(args.seed)))
    for step in range(1, args.steps + 1):
        model.train()
        batch = [rows[i] for i in order.next()]
        loss = sft_loss(model, *sft_batch(tok, batch))
        optimiser_step(opt, loss, lr_at(step - 1))
        if step % args.eval_every and step != args.steps:
            continue
        acc_val = task.greedy(model, tok, val)
        acc_all = task.greedy(model, tok, task.measured(train, val))
        msg = (f"step {step:4d} loss {loss.item():.3f} greedy held-out {acc_val:.3f} "
               f"all {acc_all:.3f}")
        if args.early_stop and in_window(args, acc_val, acc_all):
            mean_s, pass_k = task.sampled(model, tok, val, k=8, seed=args.seed)
            log(f"{msg} sampled {mean_s:.3f} pass@8 {pass_k:.3f}")
            if pass_k >= args.min_pass:
                return step
        else:
            log(msg)
    if args.early_stop:
        raise SystemExit(f"no check within {args.steps} steps met the stopping rule")
    return args.steps


# -------------------------------------------------------------------------------- main
def main(argv=None) -> None:
    from tiny_model_rl_check import rl_check

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=["arithmetic", "repeat"], default="arithmetic",
                    help="the built-in task (data.builtin_task) the model is made for")
    ap.add_argument("--out", type=Path, default=None,
                    help="default: the task's asset folder (tiny_arith or tiny_repeat)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4,
                    help="attention heads (head dimension = hidden / heads)")
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="key/value heads (grouped-query attention); default: --heads")
    ap.add_argument("--head-dim", type=int, default=None,
                    help="attention head dimension; default: --hidden / --heads")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--confuse-rate", type=float, default=0.0,
                    help="weight of the other operation's result in the corpus (0: clean)")
    ap.add_argument("--confuse-min-b", type=int, default=3,
                    help="the corpus mixes up + and - when the second operand is >= this")
    ap.add_argument("--early-stop", action=argparse.BooleanOptionalAction, default=True,
                    help="stop at the first check in the window with pass@8 >= --min-pass")
    ap.add_argument("--lo", type=float, default=0.15, help="greedy accuracy window, low")
    ap.add_argument("--hi", type=float, default=0.35, help="greedy accuracy window, high")
    ap.add_argument("--min-pass", type=float, default=0.75, help="pass@8 needed")
    ap.add_argument("--rl-check", action="store_true", help="a GRPO-like check afterwards")
    ap.add_argument("--rl-only", action="store_true", help="only the check, on --out")
    ap.add_argument("--rl-lr", type=float, default=3e-4)
    ap.add_argument("--rl-batch", type=int, default=32)
    ap.add_argument("--rl-n", type=int, default=8)
    ap.add_argument("--rl-max-new", type=int, default=4)
    ap.add_argument("--rl-prompts", choices=["train", "all"], default="train")
    ap.add_argument("--rl-seconds", type=float, default=180.0)
    ap.add_argument("--rl-steps", type=int, default=100_000)
    ap.add_argument("--rl-eval-every", type=int, default=5)
    args = ap.parse_args(argv)
    if args.task == "repeat":
        from tiny_repeat import TASK as task

        if args.rl_check or args.rl_only or args.confuse_rate:
            raise SystemExit("--rl-check, --rl-only and --confuse-rate are the arithmetic "
                             "task's; check a repeat model with siirl-train (its model card)")
    else:
        task = arithmetic_task()
    args.out = args.out or task.asset_dir
    if args.kv_heads is None:
        args.kv_heads = args.heads
    head_dim = args.head_dim or args.hidden // args.heads

    log = timed_log()
    seeded(args.seed, python_random=True)
    train, val = task.split(args.seed)
    if args.rl_only:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.out)
        model = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32)
        rl_check(model, tok, train, val, args, log)
        return

    tok = build_tokenizer(task.max_positions)
    model = build_model(tok, args.hidden, args.layers, args.heads, args.kv_heads,
                        args.head_dim, task.max_positions)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"vocab {len(tok)}, params {n_params:,}, train {len(train)}, held-out {len(val)}")
    steps = pretrain(model, tok, train, val, args, log, task)
    greedy_val = task.greedy(model, tok, val)
    greedy_all = task.greedy(model, tok, task.measured(train, val))
    sampled_val, pass8_val = task.sampled(model, tok, val, k=8, seed=args.seed)
    log(f"after {steps} steps: greedy held-out {greedy_val:.3f}, all {greedy_all:.3f}; "
        f"sampled held-out {sampled_val:.3f}, pass@8 {pass8_val:.3f}")
    ok = in_window(args, greedy_val, greedy_all) and pass8_val >= args.min_pass

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    model.save_pretrained(out)
    save_tokenizer(tok, out)
    info = dict(
        name=out.name, command=_command(argv), out=_shown_path(out),
        params=n_params, hidden=args.hidden, layers=args.layers, heads=args.heads,
        kv_heads=args.kv_heads, head_dim=head_dim, vocab=len(tok),
        seed=args.seed, steps=steps, lr=args.lr, wd=args.wd, batch_size=args.batch_size,
        confuse_rate=args.confuse_rate, confuse_min_b=args.confuse_min_b,
        n_problems=len(train) + len(val), n_val=len(val), greedy_val=round(greedy_val, 4),
        greedy_all=round(greedy_all, 4), sampled_val=round(sampled_val, 4),
        pass8_val=round(pass8_val, 4),
    )
    if args.task == "repeat":
        info.update(_repeat_info(model, tok, train, args, log))
    finish(out, task.card(info), log)
    print(json.dumps(info))
    if args.rl_check:
        rl_check(model, tok, train, val, args, log)
    log(f"done in {time.time() - log.t0:.1f}s")
    if not ok:
        raise SystemExit(f"out of the window [{args.lo}, {args.hi}] or pass@8 < "
                         f"{args.min_pass}: adjust the settings")


def _repeat_info(model, tok, train, args, log) -> dict:
    """The repeat card's extra lines: the window, and the greedy response lengths on the
    training rows (the long tail the asynchronous preset is about)."""
    from tiny_repeat import response_lengths

    lengths = sorted(response_lengths(model, tok, [p for p, _ in train]))
    stats = dict(mean=sum(lengths) / len(lengths), p50=lengths[len(lengths) // 2],
                 p90=lengths[int(0.9 * len(lengths))], max=lengths[-1])
    log(f"greedy response lengths on {len(lengths)} training rows: {stats}")
    minutes = max(1, round((time.time() - log.t0) / 60))
    return dict(lengths=stats, lo=args.lo, hi=args.hi, min_pass=args.min_pass, n_train=len(train),
                took=f"about {minutes} minute{'s' if minutes > 1 else ''}")


def _shown_path(path: Path) -> str:
    """``path`` relative to the repository when inside it (as the model card shows it)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _command(argv) -> str:
    """The command that built the model, for its card: the arguments as given (``--out``
    relative to the repository), without the RL-check options, which change nothing saved."""
    args = list(sys.argv[1:] if argv is None else argv)
    kept, i = [], 0
    while i < len(args):
        a = args[i]
        name = a.split("=", 1)[0]
        if name in ("--rl-check", "--rl-only"):
            i += 1
            continue
        if name.startswith("--rl-"):  # --rl-lr 1e-3 or --rl-lr=1e-3
            i += 1 if "=" in a else 2
            continue
        if name == "--out":
            value = a.split("=", 1)[1] if "=" in a else args[i + 1]
            kept += ["--out", _shown_path(Path(value))]
            i += 1 if "=" in a else 2
            continue
        kept.append(a)
        i += 1
    return command_line("make_tiny_model.py", kept)


if __name__ == "__main__":
    main()
