"""The plain KV-cached decoding loop: prefill the whole batch, then one token per step,
finished rows fed pads to the end. ``sampler.decode`` must give exactly its tokens; it is
kept as that yardstick (tests, ``tools/bench/sampler.py``) and as the fallback for modules
whose cache is not a transformers ``Cache``."""

from __future__ import annotations

from typing import Callable

import torch

from siirl.engine.models.logprob import accepts_kwarg, token_logprobs
from siirl.engine.rollout.decoded import Decoded
from siirl.engine.rollout.keyed_random import uniforms
from siirl.engine.rollout.kv_cache import cache_argument, output_cache
from siirl.engine.rollout.sampling import sample_next_token

__all__ = ["reference_decode"]


@torch.no_grad()
def reference_decode(module: torch.nn.Module, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor, position_ids: torch.Tensor,
                     max_new_tokens: int, eos_ids: list[int], pad_id: int, greedy: bool,
                     temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0,
                     keys: torch.Tensor | None = None,
                     extras: dict[str, torch.Tensor] | None = None,
                     with_log_probs: bool = False, first_draw: int = 0,
                     pause: Callable[[], bool] | None = None):
    """Same contract as ``sampler.decode``, ``pause`` included (asked between steps)."""
    rows = input_ids.shape[0]
    unfinished = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
    if max_new_tokens <= 0 or rows == 0:
        empty = input_ids.new_zeros((rows, 0))
        if pause is not None:
            return Decoded(empty, empty.float() if with_log_probs else None, unfinished)
        return (empty, empty.float()) if with_log_probs else empty
    keep_last = {"logits_to_keep": 1} if accepts_kwarg(module, "logits_to_keep") else {}
    cache_name = cache_argument(module)
    eos = torch.tensor(eos_ids, dtype=input_ids.dtype, device=input_ids.device)
    out = module(input_ids=input_ids, attention_mask=attention_mask,
                 position_ids=position_ids, use_cache=True, **keep_last, **(extras or {}))
    next_pos = position_ids[:, -1:] + 1
    finished = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
    ones = attention_mask.new_ones((rows, 1))
    tokens, log_probs = [], []
    for step in range(max_new_tokens):
        noise = uniforms(keys, first_draw + step) if keys is not None and not greedy else None
        tok = sample_next_token(out.logits[:, -1, :], greedy, temperature, top_k, top_p,
                                noise)
        if with_log_probs:
            chosen = token_logprobs(out.logits[:, -1, :], tok, temperature)[0]
            log_probs.append(torch.where(finished, torch.zeros_like(chosen), chosen))
        tok = torch.where(finished, torch.full_like(tok, pad_id), tok)
        tokens.append(tok)
        finished |= torch.isin(tok, eos)
        if step == max_new_tokens - 1 or bool(finished.all()):
            break
        if pause is not None and pause():
            unfinished = ~finished
            break
        attention_mask = torch.cat([attention_mask, ones], dim=1)
        out = module(input_ids=tok[:, None], attention_mask=attention_mask,
                     position_ids=next_pos, use_cache=True, **keep_last,
                     **{cache_name: output_cache(out)})
        next_pos = next_pos + 1
    tokens = torch.stack(tokens, dim=1)
    log_probs = torch.stack(log_probs, dim=1) if with_log_probs else None
    if pause is not None:
        return Decoded(tokens, log_probs, unfinished)
    return tokens if log_probs is None else (tokens, log_probs)
