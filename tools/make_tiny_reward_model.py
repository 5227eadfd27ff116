"""Build siiRL's built-in tiny reward model (``siirl/engine/assets/tiny_reward``,
``reward_model.model.path=builtin:tiny-reward``).

    python tools/make_tiny_reward_model.py        # about two minutes on one CPU thread

A ``LlamaForSequenceClassification`` (one output) that reads a prompt of the built-in
arithmetic task and a response, ``"13+5=" + "18</s>"``, and scores it near 1 when the
response's first integer is the answer (what the task's rule reward checks) and near 0
otherwise. It starts from the built-in policy ``tiny_arith`` (same tokenizer and body, a
new score head) and is trained by regression onto the rule's 0/1 label, so its scores sit
on the rule's scale, while it keeps learning to write the right answers (see ``train``).

Data: the responses the RL job will show it. For every problem, samples of ``tiny_arith``
at temperature 1 (what the policy writes early in training), plus the right answer and
near misses (off by 1, 2 or 10, the other operation's result, digits swapped; with and
without EOS), each labelled by the rule. 20% of the problems are held out: the model card
reports accuracy (score > 0.5 versus the rule) and ROC AUC on their responses.

Seeded, one CPU thread, deterministic algorithms: a re-run gives the same weights on the
same torch build.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tiny_arith import (
    EOS_ID,
    PAD_ID,
    PROMPT_RE,
    encode_prompts,
    first_integer,
    generate,
    split_problems,
)
from tiny_build import finish, left_padded, remake, seeded, timed_log

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "packages/siirl-engine/src/siirl/engine/assets"
POLICY_DIR = ASSETS / "tiny_arith"
ASSET_DIR = ASSETS / "tiny_reward"

Example = tuple[list[int], float]  # (prompt + response ids, rule label)


def near_misses(answer: int, a: int, b: int, op: str) -> list[str]:
    """Wrong answers a weak policy writes: off by a little, the other operation, reversed."""
    other = a - b if op == "+" else a + b
    wrong = {answer + d for d in (-10, -2, -1, 1, 2, 10)} | {other}
    if answer >= 10:
        wrong.add(int(str(answer)[::-1]))
    return [str(w) for w in sorted(wrong) if w != answer]


def examples_for(tok, policy, problems, samples: int, gen) -> list[Example]:
    """Every problem's policy samples and hand-made answers, labelled by the rule, once
    each (duplicate sequences collapse to one example)."""
    prompts = [p for p, _ in problems for _ in range(samples)]
    ids, mask = encode_prompts(tok, prompts)
    sampled = generate(policy, ids, mask, max_new=4, temperature=1.0, gen=gen)
    seen, out = set(), []

    def add(prompt: str, answer: int, response_ids: list[int]) -> None:
        seq = tok.encode(prompt, add_special_tokens=False) + response_ids
        if tuple(seq) in seen:
            return
        seen.add(tuple(seq))
        text = tok.decode(response_ids, skip_special_tokens=True)
        out.append((seq, 1.0 if first_integer(text) == answer else 0.0))

    for row, prompt in enumerate(prompts):
        answer = problems[row // samples][1]
        add(prompt, answer, [t for t in sampled[row].tolist() if t != PAD_ID])
    for prompt, answer in problems:
        a, op, b = PROMPT_RE.fullmatch(prompt).groups()
        for text in [str(answer)] + near_misses(answer, int(a), int(b), op):
            ids_ = tok.encode(text, add_special_tokens=False)
            add(prompt, answer, ids_ + [EOS_ID])
            add(prompt, answer, ids_)  # cut at the length limit: no EOS
    return out


def batch_of(examples: list[Example]) -> tuple[torch.Tensor, ...]:
    """Left-padded ids, mask and positions (as the reward engine feeds them), labels."""
    labels = torch.tensor([label for _, label in examples])
    return *left_padded([seq for seq, _ in examples]), labels


def scores_of(model, examples: list[Example], chunk: int = 512) -> torch.Tensor:
    """The score at each sequence's last token (the engine's pooling)."""
    model.eval()
    parts = []
    with torch.no_grad():
        for start in range(0, len(examples), chunk):
            ids, mask, pos, _ = batch_of(examples[start:start + chunk])
            parts.append(model(input_ids=ids, attention_mask=mask,
                               position_ids=pos).logits[:, 0])
    return torch.cat(parts)


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC: the chance that a random right response outscores a random wrong one."""
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    if not len(pos) or not len(neg):
        return float("nan")
    wins = (pos[:, None] > neg[None, :]).float() + 0.5 * (pos[:, None] == neg[None, :]).float()
    return wins.mean().item()


def measure(model, examples: list[Example]) -> dict:
    scores = scores_of(model, examples)
    labels = torch.tensor([label for _, label in examples])
    right = (scores > 0.5).float() == labels
    return {"examples": len(examples), "correct_share": round(labels.mean().item(), 4),
            "accuracy": round(right.float().mean().item(), 4),
            "accuracy_correct": round(right[labels > 0.5].float().mean().item(), 4),
            "accuracy_incorrect": round(right[labels <= 0.5].float().mean().item(), 4),
            "auc": round(auc(scores, labels), 4)}


def answer_batch(tok, problems) -> tuple[torch.Tensor, ...]:
    """Prompts with their right answer and EOS, left-padded, and next-token targets on the
    answer tokens (-100 elsewhere)."""
    seqs = [(tok.encode(p, add_special_tokens=False),
             tok.encode(str(a), add_special_tokens=False) + [EOS_ID]) for p, a in problems]
    ids, mask, pos, _ = batch_of([(p + a, 1.0) for p, a in seqs])
    targets = torch.full(ids.shape, -100, dtype=torch.long)
    width = ids.shape[1]
    for row, (_, answer) in enumerate(seqs):
        targets[row, width - len(answer) - 1:width - 1] = torch.tensor(answer)
    return ids, mask, pos, targets


def train(model, tok, examples: list[Example], problems, args, log) -> None:
    """Regression onto the 0/1 labels (right and wrong answers weighted equally), plus the
    policy's own next-token loss on the right answers through the tied embeddings: it keeps
    the body computing the answer, which the score head then compares with the response.
    Without it the model does not learn to tell near misses from the answer."""
    rng = random.Random(args.seed)
    positives = sum(label for _, label in examples)
    weight_pos = len(examples) / (2 * max(positives, 1))
    weight_neg = len(examples) / (2 * max(len(examples) - positives, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.wd)
    body, embed = model.model, model.model.embed_tokens
    for step in range(1, args.steps + 1):
        rows = [examples[rng.randrange(len(examples))] for _ in range(args.batch_size)]
        ids, mask, pos, labels = batch_of(rows)
        model.train()
        hidden = body(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
        scores = model.score(hidden)[:, -1, 0]
        weights = torch.where(labels > 0.5, weight_pos, weight_neg)
        loss = (weights * (scores - labels) ** 2).mean()
        ids, mask, pos, targets = answer_batch(
            tok, [problems[rng.randrange(len(problems))] for _ in range(args.batch_size)])
        hidden = body(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
        logits = hidden @ embed.weight.T
        lm = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        total = loss + args.lm_weight * lm
        for group in opt.param_groups:  # linear warm-up, then linear decay to 10%
            group["lr"] = args.lr * min(step / 50, 1.0 - 0.9 * step / args.steps)
        opt.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps:
            log(f"step {step}: score loss {loss.item():.4f}, answer loss {lm.item():.4f}")


def card_text(info: dict) -> str:
    """README.md from what the build measured."""
    held, seen = info["held_out"], info["train_fit"]
    return f"""# tiny_reward

A tiny reward model ({info["params"]:,} parameters, float32) for siiRL's built-in
arithmetic task: `reward_model.enable=true reward_model.model.path=builtin:tiny-reward`.
It is not useful for anything else.

* Input: the task's prompt and a response, `"13+5=" + "18</s>"`, in the built-in
  `tiny_arith` tokenizer (one token per character, no chat template, left padding).
* Output: one number at the last token (`LlamaForSequenceClassification`, `num_labels=1`),
  near 1 when the response's first integer is the answer and near 0 when it is not: the
  rule reward's scale, so `reward_model.rm_weight=1` weighs the two alike.
* Model: the body of `tiny_arith` (hidden {info["hidden"]}, {info["layers"]} layers) with a
  new score head, all weights fine-tuned.

## How it was made

`tools/make_tiny_reward_model.py`, seed {info["seed"]}: {info["steps"]} steps of AdamW (lr
{info["lr"]}, batch {info["batch_size"]}): squared error to the rule's 0/1 label, right and
wrong answers weighted equally, plus {info["lm_weight"]} times the next-token loss on the right
answers (through the tied embeddings: the body keeps computing the answer, which the head
compares with the response; without it the model cannot tell near misses from the answer).
Examples: for each problem {info["samples"]} samples of
`tiny_arith` at temperature 1, the right answer and near misses (off by 1, 2 or 10, the
other operation's result, digits swapped), with and without EOS. 80% of the task's
{info["n_problems"]} problems train it; the other {info["n_val"]} are held out.

| measure (score > 0.5 versus the rule) | held-out problems | training problems |
| --- | --- | --- |
| responses | {held["examples"]} | {seen["examples"]} |
| share of right responses | {held["correct_share"]} | {seen["correct_share"]} |
| accuracy | {held["accuracy"]} | {seen["accuracy"]} |
| accuracy on right responses | {held["accuracy_correct"]} | {seen["accuracy_correct"]} |
| accuracy on wrong responses | {held["accuracy_incorrect"]} | {seen["accuracy_incorrect"]} |
| ROC AUC | {held["auc"]} | {seen["auc"]} |

{remake("python tools/make_tiny_reward_model.py", f'took {info["seconds"]:.0f} s')}"""


def main(argv=None) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ASSET_DIR)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=16, help="policy samples per problem")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--lm-weight", type=float, default=1.0,
                    help="weight of the next-token loss on the right answers")
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--log-every", type=int, default=500)
    args = ap.parse_args(argv)

    log = timed_log()
    seeded(args.seed)
    tok = AutoTokenizer.from_pretrained(POLICY_DIR)
    policy = AutoModelForCausalLM.from_pretrained(POLICY_DIR, dtype=torch.float32).eval()
    train_problems, val_problems = split_problems(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    train_set = examples_for(tok, policy, train_problems, args.samples, gen)
    val_set = examples_for(tok, policy, val_problems, args.samples, gen)
    log(f"{len(train_set)} training examples ({sum(label for _, label in train_set):.0f} right), "
        f"{len(val_set)} held out")

    model = AutoModelForSequenceClassification.from_pretrained(
        POLICY_DIR, num_labels=1, dtype=torch.float32, problem_type="regression")
    model.config.pad_token_id = PAD_ID
    model.config.tie_word_embeddings = False
    torch.nn.init.zeros_(model.score.weight)  # start at score 0 everywhere
    train(model, tok, train_set, train_problems, args, log)
    info = dict(seed=args.seed, steps=args.steps, lr=args.lr, batch_size=args.batch_size,
                lm_weight=args.lm_weight,
                samples=args.samples, hidden=model.config.hidden_size,
                layers=model.config.num_hidden_layers,
                params=sum(p.numel() for p in model.parameters()),
                n_problems=len(train_problems) + len(val_problems), n_val=len(val_problems),
                held_out=measure(model, val_set), train_fit=measure(model, train_set))
    log(f"held out: {info['held_out']}; training: {info['train_fit']}")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model.config.architectures = ["LlamaForSequenceClassification"]
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the policy's, byte for byte
        shutil.copyfile(POLICY_DIR / name, out / name)
    info["seconds"] = time.time() - log.t0
    finish(out, card_text(info), log)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
