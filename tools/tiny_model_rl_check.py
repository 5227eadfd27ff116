"""GRPO-like check of the built-in tiny model: does a 0/1 reward raise greedy accuracy?

Run through ``python tools/make_tiny_model.py --rl-check`` (after building) or ``--rl-only``
(on the saved model). Kept apart from the builder so the builder stays one purpose.
"""

from __future__ import annotations

import random
import time

import torch
from tiny_arith import (
    PAD_ID,
    encode_prompts,
    generate,
    greedy_accuracy,
    position_ids_of,
    rewards_of,
)


def rl_check(model, tok, train, val, args, log) -> list[tuple]:
    """A GRPO-like loop: ``--rl-n`` samples per prompt at temperature 1, 0/1 reward,
    group-normalised advantages, token-mean policy-gradient loss on the response tokens
    (one on-policy update per batch, so no ratio/clip and no KL)."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.rl_lr, weight_decay=0.0)
    rng = random.Random(args.seed + 1)
    gen = torch.Generator().manual_seed(args.seed + 1)
    pool = train if args.rl_prompts == "train" else train + val
    log(f"RL check: lr {args.rl_lr}, {args.rl_batch} prompts x {args.rl_n} samples, "
        f"prompts from {args.rl_prompts} ({len(pool)}), up to {args.rl_seconds:.0f}s")
    n = args.rl_n
    start = time.time()

    def evaluate(step: int, reward: float | None) -> tuple:
        el = time.time() - start
        a = (greedy_accuracy(model, tok, val), greedy_accuracy(model, tok, train),
             greedy_accuracy(model, tok, train + val))
        r = "" if reward is None else f"batch reward {reward:.3f} "
        log(f"RL step {step:4d} t {el:6.1f}s {r}greedy held-out {a[0]:.3f} "
            f"train {a[1]:.3f} all {a[2]:.3f}")
        return (step, el, *a)

    history = [evaluate(0, None)]
    step = 0
    while time.time() - start < args.rl_seconds and step < args.rl_steps:
        step += 1
        batch = rng.sample(pool, args.rl_batch)
        prompts = [p for p, _ in batch for _ in range(n)]
        answers = [a for _, a in batch for _ in range(n)]
        ids, mask = encode_prompts(tok, prompts)
        model.eval()
        resp = generate(model, ids, mask, max_new=args.rl_max_new, temperature=1.0, gen=gen)
        r = rewards_of(tok, resp, answers)
        g = r.view(-1, n)
        adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1)
        resp_mask = resp != PAD_ID  # the response up to and including its EOS
        seq = torch.cat([ids, resp], 1)
        seq_mask = torch.cat([mask, resp_mask.long()], 1)
        model.train()
        logits = model(input_ids=seq, attention_mask=seq_mask,
                       position_ids=position_ids_of(seq_mask)).logits
        logp = torch.log_softmax(logits[:, ids.shape[1] - 1: -1].float(), -1)
        logp = logp.gather(-1, resp[:, :, None]).squeeze(-1)
        m = resp_mask.float()
        loss = -(logp * adv[:, None] * m).sum() / m.sum().clamp(min=1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.rl_eval_every == 0:
            history.append(evaluate(step, r.mean().item()))
    if history[-1][0] != step:
        history.append(evaluate(step, None))
    s0, s1 = history[0], history[-1]
    hit = next((h for h in history if h[2] - s0[2] >= 0.3), None)
    log(f"RL check: greedy held-out {s0[2]:.3f} -> {s1[2]:.3f}, all {s0[4]:.3f} -> "
        f"{s1[4]:.3f} in {s1[0]} steps / {s1[1]:.0f}s; held-out +0.30 reached "
        + (f"at step {hit[0]} ({hit[1]:.1f}s)" if hit else "never"))
    return history


