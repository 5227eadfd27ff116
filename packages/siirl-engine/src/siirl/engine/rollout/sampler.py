"""The ``hf`` rollout's decoding loop: the tokens of ``reference.reference_decode``, for less.

Two savings, neither of which changes a token:

- a prompt is prefilled once for its ``n`` samples (consecutive equal rows), then its KV
  cache rows and last logits are copied to the samples' rows;
- rows that emitted EOS leave the batch (their cache rows are dropped) once enough of them
  have, instead of being fed pads to the end.

Tokens stay bitwise equal to the reference loop because every row's arithmetic is the same:
a linear layer's rows do not depend on the other rows of its batch, except that BLAS
(MKL on x86) takes another path, with other rounding, for matrices of fewer than 4 rows; so
the loop never runs fewer rows than ``min(rows, 4)`` where the reference ran ``rows``.

Partial rollouts (``partial_rollout``): given ``pause`` (a no-argument callable, the pause
hook's ``pending``), the loop asks it between decode steps, after each token and before the
next forward, and stops early when it says True; it then returns a ``Decoded`` naming the
rows the pause stopped, so that the caller can load new weights and continue them from
prompt + tokens so far (``first_draw``: the continuation's noise is the row's own stream at
its token offset). Without ``pause`` nothing is asked and the return value is unchanged.

Measured and left out (tools/bench/sampler.py, CPU): a static or preallocated KV cache
written in place instead of transformers' per-step ``torch.cat`` was no faster on the
built-in model or SmolLM2-135M (and a static cache changes logits by ~1e-5: attention runs
over the padded length).
"""

from __future__ import annotations

from typing import Callable

import torch

from siirl.engine.models.logprob import accepts_kwarg, token_logprobs
from siirl.engine.rollout.decoded import Decoded
from siirl.engine.rollout.keyed_random import uniforms
from siirl.engine.rollout.kv_cache import cache_argument, output_cache
from siirl.engine.rollout.sampling import sample_next_token

__all__ = ["Decoded", "decode", "distinct_rows"]

# fewer rows than this and a matmul's rounding can change (see the module docstring)
_MIN_ROWS = 4


def _result(tokens, log_probs, unfinished, pause):
    if pause is not None:
        return Decoded(tokens, log_probs, unfinished)
    return tokens if log_probs is None else (tokens, log_probs)


def distinct_rows(*columns: torch.Tensor, at_least: int = 1
                  ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first, inverse)`` for runs of equal consecutive rows of the side-by-side
    ``columns`` (the ``n`` samples of a prompt sit together): the index of each run's first
    row (padded with repeats of row 0 to ``at_least``) and, per row, its run's position in
    ``first``. None when no row equals the one before it."""
    whole = torch.cat([c.reshape(c.shape[0], -1).to(torch.int64) for c in columns], dim=1)
    starts = torch.ones(whole.shape[0], dtype=torch.bool, device=whole.device)
    starts[1:] = (whole[1:] != whole[:-1]).any(dim=1)
    first = starts.nonzero().squeeze(1)
    if first.numel() == whole.shape[0]:
        return None
    if first.numel() < at_least:
        first = torch.cat([first, first[:1].expand(at_least - first.numel())])
    return first, starts.cumsum(0) - 1


@torch.no_grad()
def decode(module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
           position_ids: torch.Tensor, max_new_tokens: int, eos_ids: list[int], pad_id: int,
           greedy: bool, temperature: float = 1.0, top_k: int = -1,
           top_p: float = 1.0, keys: torch.Tensor | None = None,
           extras: dict[str, torch.Tensor] | None = None, with_log_probs: bool = False,
           first_draw: int = 0, pause: Callable[[], bool] | None = None):
    """Generated tokens [B, T<=max_new_tokens] for left-padded prompts; rows that finished
    (emitted an EOS) get ``pad_id`` afterwards; stops early once every row finished.
    ``with_log_probs``: ``(tokens, log_probs)``, each sampled token's log-prob under the
    logits / temperature (float32, before top-k/top-p: what the trainer computes), 0 after
    a row finished.
    ``keys`` (int64 [B]) give each row its own random stream (see ``keyed_random``).
    ``extras`` (per-row tensors, e.g. a VLA's ``pixel_values``) go to the prefill only: the
    steps after it feed new tokens, which the cache already conditions on them.
    ``first_draw``: the keyed draw number of the first new token (a continued row's token
    offset). ``pause``: asked between steps; True stops the loop and the result is a
    ``Decoded`` (always one when ``pause`` is given)."""
    rows, width = input_ids.shape
    if max_new_tokens <= 0 or rows == 0:
        empty = input_ids.new_zeros((rows, 0))
        return _result(empty, empty.float() if with_log_probs else None,
                       torch.zeros(rows, dtype=torch.bool, device=input_ids.device), pause)
    floor = min(rows, _MIN_ROWS)
    keep_last = {"logits_to_keep": 1} if accepts_kwarg(module, "logits_to_keep") else {}
    cache_name = cache_argument(module)
    eos = torch.tensor(eos_ids, dtype=input_ids.dtype, device=input_ids.device)
    prompt = (input_ids, attention_mask, position_ids)
    extras = dict(extras or {})
    # rows are equal only when their extra inputs are too (two images, one instruction)
    groups = distinct_rows(*prompt, *extras.values(), at_least=floor)
    prefill_extras = extras
    if groups is not None:  # prefill one row per prompt
        prompt = tuple(t.index_select(0, groups[0]) for t in prompt)
        prefill_extras = {k: v.index_select(0, groups[0]) for k, v in extras.items()}
    out = module(input_ids=prompt[0], attention_mask=prompt[1], position_ids=prompt[2],
                 use_cache=True, **keep_last, **prefill_extras)
    cache = output_cache(out)
    if not hasattr(cache, "reorder_cache"):  # not a transformers Cache: the plain loop
        from siirl.engine.rollout.reference import reference_decode
        return reference_decode(module, input_ids, attention_mask, position_ids,
                                max_new_tokens, eos_ids, pad_id, greedy, temperature,
                                top_k, top_p, keys, extras, with_log_probs, first_draw,
                                pause)
    logits = out.logits[:, -1, :]
    if groups is not None:  # then one row per sample
        logits = logits.index_select(0, groups[1])
        cache.reorder_cache(groups[1])
    # the whole mask up front: step s reads its first width + s + 1 columns
    mask = torch.cat([attention_mask, attention_mask.new_ones((rows, max_new_tokens))], dim=1)
    next_pos = position_ids[:, -1:] + 1
    tokens = input_ids.new_full((rows, max_new_tokens), pad_id)
    log_probs = torch.zeros((rows, max_new_tokens), dtype=torch.float32,
                            device=input_ids.device) if with_log_probs else None
    live = torch.arange(rows, device=input_ids.device)  # output row of each batch row
    finished = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
    step, unfinished = 0, torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
    for step in range(max_new_tokens):
        noise = uniforms(keys, first_draw + step) if keys is not None and not greedy else None
        tok = sample_next_token(logits, greedy, temperature, top_k, top_p, noise)
        if log_probs is not None:
            chosen = token_logprobs(logits, tok, temperature)[0]
            log_probs[live, step] = torch.where(finished, torch.zeros_like(chosen), chosen)
        tok = torch.where(finished, torch.full_like(tok, pad_id), tok)
        tokens[live, step] = tok
        finished |= torch.isin(tok, eos)
        left = max_new_tokens - 1 - step  # forwards still to run
        if left == 0:
            break
        done = int(finished.sum())
        if done == live.numel():
            break
        if pause is not None and pause():
            unfinished[live[~finished]] = True
            break
        # copying the cache once costs about one step's attention; dropping `done` of the
        # live rows saves that share of each step still to come
        if done and done * left >= live.numel() and live.numel() > floor:
            kept = (~finished).nonzero().squeeze(1)
            if kept.numel() < floor:
                kept = torch.cat([kept, finished.nonzero().squeeze(1)[:floor - kept.numel()]])
            cache.reorder_cache(kept)
            live, tok, mask, next_pos, finished = (t.index_select(0, kept) for t in
                                                   (live, tok, mask, next_pos, finished))
            if keys is not None:
                keys = keys.index_select(0, kept.to(keys.device))
        out = module(input_ids=tok[:, None], attention_mask=mask[:, :width + step + 1],
                     position_ids=next_pos, use_cache=True, **keep_last,
                     **{cache_name: cache})
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    return _result(tokens[:, :step + 1],
                   None if log_probs is None else log_probs[:, :step + 1], unfinished, pause)
