"""The tiny arithmetic task and sampling from a model on it.

Shared by the builder (``make_tiny_model.py``) and its RL check (``tiny_model_rl_check.py``)
so that neither imports the other's internals and the two scripts do not import each other.
"""

from __future__ import annotations

import random
import re

import torch
import torch.nn.functional as F

# the builders' shared special tokens, imported from here with the task
from tiny_build import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID  # noqa: F401

CHARS = list("0123456789+-= ") + list("abcdefghijklmnopqrstuvwxyz") + list(".,:;!?'\"()*/%_")
MAX_OPERAND = 20
PROMPT_RE = re.compile(r"(\d+)([+-])(\d+)=")


# -------------------------------------------------------------------------------- task
def all_problems() -> list[tuple[str, int]]:
    """Every prompt of the task with its answer: 441 additions and 231 subtractions."""
    out = []
    for a in range(MAX_OPERAND + 1):
        for b in range(MAX_OPERAND + 1):
            out.append((f"{a}+{b}=", a + b))
            if a >= b:
                out.append((f"{a}-{b}=", a - b))
    return out


def split_problems(seed: int, val_frac: float = 0.2):
    problems = all_problems()
    random.Random(seed).shuffle(problems)
    n_val = int(round(len(problems) * val_frac))
    return problems[n_val:], problems[:n_val]


def encode_prompts(tok, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and attention mask, as the dataset feeds the rollout."""
    enc = tok(prompts, padding=True, return_tensors="pt", add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


# -------------------------------------------------------------------------- generation
def position_ids_of(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate(model, ids, mask, max_new: int = 4, temperature: float = 0.0, gen=None):
    """Greedy (temperature 0) or plain sampling (no top-k/top-p), stopping at EOS, padding
    after it. Returns the response ids [B, max_new]. Recomputes the whole sequence each
    step: prompts are <= 6 tokens and answers <= 3, so a KV cache would buy nothing."""
    done = torch.zeros(ids.shape[0], dtype=torch.bool)
    out = []
    for _ in range(max_new):
        logits = model(input_ids=ids, attention_mask=mask,
                       position_ids=position_ids_of(mask)).logits[:, -1].float()
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        else:
            nxt = logits.argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, PAD_ID), nxt)
        out.append(nxt)
        ids = torch.cat([ids, nxt[:, None]], 1)
        mask = torch.cat([mask, (~done).long()[:, None]], 1)
        done = done | (nxt == EOS_ID)
        if bool(done.all()):
            break
    resp = torch.stack(out, 1)
    return F.pad(resp, (0, max_new - resp.shape[1]), value=PAD_ID)


def first_integer(text: str) -> int | None:
    """As siirl.engine.reward_score.arithmetic: the first (possibly negative) integer."""
    m = re.search(r"-?\d+", text)
    return int(m.group()) if m else None


def rewards_of(tok, resp: torch.Tensor, answers: list[int]) -> torch.Tensor:
    texts = tok.batch_decode(resp.tolist(), skip_special_tokens=True)
    hits = [first_integer(t) == a for t, a in zip(texts, answers, strict=True)]
    return torch.tensor(hits, dtype=torch.float32)


@torch.no_grad()
def greedy_accuracy(model, tok, problems, max_new: int = 4) -> float:
    model.eval()
    ids, mask = encode_prompts(tok, [p for p, _ in problems])
    resp = generate(model, ids, mask, max_new=max_new)
    return rewards_of(tok, resp, [a for _, a in problems]).mean().item()


@torch.no_grad()
def sampled_stats(model, tok, problems, k: int = 8, seed: int = 0, max_new: int = 4):
    """(mean sampled accuracy, pass@k) at temperature 1, top_p 1, no top_k."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    prompts = [p for p, _ in problems for _ in range(k)]
    answers = [a for _, a in problems for _ in range(k)]
    ids, mask = encode_prompts(tok, prompts)
    resp = generate(model, ids, mask, max_new=max_new, temperature=1.0, gen=gen)
    r = rewards_of(tok, resp, answers).view(len(problems), k)
    return r.mean().item(), (r.max(1).values > 0).float().mean().item()
