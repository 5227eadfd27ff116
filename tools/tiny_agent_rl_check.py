"""A short GRPO-like check of the built-in tiny agent (or ``--model DIR``): does group-
normalized policy gradient on its own episodes raise its success within minutes?

    python tools/tiny_agent_rl_check.py --seconds 180

Each iteration plays ``--groups`` seeds x ``--n`` sampled episodes per environment through
the trajectory env manager (the settings in the model's ``agent_envs.json``), scores each
episode by success (0/1), normalizes within its group (GRPO), and takes one AdamW step on
``-advantage * log-prob`` of the agent's tokens (mask 1). Greedy and sampled success on the
builder's held-out seeds are printed before and every ``--eval-every`` iterations. Not the
AGENTIC pipeline (no KL, no clipping, no reference): a quick read on whether the start has
signal GRPO can use. One CPU thread, seeded.
"""

from __future__ import annotations

import argparse
import random
import time

import torch
import torch.nn.functional as F
from make_tiny_agent import ENVS, ModelPolicy, batch_tensors, evaluate, make, new_manager

from siirl.engine.models import loader


def play_groups(model, tok, tag: str, seeds, n: int):
    manager = new_manager(tok)
    episodes = [manager.start(make(tag), s, str(s), tag) for s in seeds for _ in range(n)]
    model.eval()
    manager.run(episodes, ModelPolicy(model, sample=True))
    for e in episodes:
        e.env.close()
    return episodes


def grpo_step(model, opt, episodes, n: int) -> float:
    rewards = torch.tensor([float(e.success) for e in episodes]).view(-1, n)
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6))
    adv = adv.flatten()
    keep = [i for i in range(len(episodes)) if adv[i] != 0]
    if not keep:
        return 0.0
    rows = [(episodes[i].ids, [0] * episodes[i].prompt_length + episodes[i].mask) for i in keep]
    ids, att, lab = batch_tensors(rows)
    model.train()
    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
    target = lab[:, 1:]
    logp = -F.cross_entropy(logits.transpose(1, 2), target.clamp(min=0), reduction="none")
    mask = (target != -100).float()
    per_seq = (logp * mask).sum(1) / mask.sum(1).clamp(min=1)
    loss = -(adv[keep] * per_seq).mean()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny-agent")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--groups", type=int, default=8, help="seeds per environment per step")
    ap.add_argument("--n", type=int, default=8, help="episodes per seed (GRPO group)")
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--eval-episodes", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model, tok = loader.load_model_and_tokenizer({"path": args.model})
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    seeds = list(range(args.eval_episodes))
    t0 = time.time()

    def report(it: int) -> None:
        parts = []
        for tag in ENVS:
            for sample in (False, True):
                r = evaluate(model, tok, tag, seeds, sample, args.seed)
                parts.append(f"{tag}/{'sampled' if sample else 'greedy'} {r['success']:.2f}")
        print(f"[{time.time() - t0:6.1f}s] iter {it:3d} " + " ".join(parts), flush=True)

    report(0)
    it = 0
    while time.time() - t0 < args.seconds:
        it += 1
        for tag in ENVS:
            group_seeds = [rng.randrange(10_000, 1_000_000) for _ in range(args.groups)]
            episodes = play_groups(model, tok, tag, group_seeds, args.n)
            grpo_step(model, opt, episodes, args.n)
        if it % args.eval_every == 0:
            report(it)
    if it % args.eval_every:
        report(it)


if __name__ == "__main__":
    main()
