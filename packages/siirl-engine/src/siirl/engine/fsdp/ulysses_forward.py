"""Packed forwards split over a Ulysses sequence-parallel group (``siirl.engine.fsdp.
ulysses``): log-probs for the actor and reference, values for the critic.

The packed row ``[1, T]`` (``siirl.engine.models.packing``) is padded to a multiple of the
group size s with a sequence of its own (positions from 0, so nothing attends to it or
from it), and rank r runs the forward on tokens ``[r*T/s, (r+1)*T/s)`` with their own
positions. Its per-token outputs (the log-prob of the next token, its entropy, a value)
are gathered over the group into ``[T]``, from which the scored response positions are
taken, exactly as the unsplit packed forward takes them. The LM head runs on T/s tokens
per rank, so no rank holds the ``[T, vocab]`` logits.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F

from siirl.engine.common.dynamic_batch import TokenBudget
from siirl.engine.fsdp.ulysses import KWARG, SequenceParallel, UlyssesForward, gather_sequence
from siirl.engine.models.logprob import token_logprobs
from siirl.engine.models.packing import Packed

__all__ = ["split_packed", "ulysses_logprobs", "ulysses_values", "widen_token_budgets"]


def split_packed(packed: Packed, sp: SequenceParallel
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, UlyssesForward]:
    """(this rank's ids ``[1, T/s]``, positions ``[1, T/s]``, next-token labels ``[T/s]``,
    the forward's context) of the packed row padded to a multiple of ``sp.size``."""
    ids, pos = packed.input_ids, packed.position_ids
    pad = -ids.shape[1] % sp.size
    if pad:
        ids = F.pad(ids, (0, pad))
        pos = torch.cat([pos, torch.arange(pad, dtype=pos.dtype, device=pos.device)[None]], 1)
    width = ids.shape[1] // sp.size
    part = slice(sp.rank * width, (sp.rank + 1) * width)
    # label of position i is token i+1; the last one wraps around and is never scored
    labels = torch.roll(ids[0], -1)[part]
    return ids[:, part], pos[:, part], labels, UlyssesForward(sp, pos)


def ulysses_logprobs(model: torch.nn.Module, packed: Packed, sp: SequenceParallel,
                     temperature: float = 1.0, calculate_entropy: bool = False
                     ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(log_probs [K], entropy [K] or None)`` as ``packed_logprobs`` gives them, computed
    by the group together (every rank of it calls, with the same ``packed``)."""
    if temperature <= 0:
        raise ValueError(f"ulysses_logprobs needs temperature > 0, got {temperature}")
    ids, pos, labels, forward = split_packed(packed, sp)
    out = model(input_ids=ids, attention_mask=None, position_ids=pos, use_cache=False,
                **{KWARG: forward})
    logits = (out.logits if hasattr(out, "logits") else out[0])[0]
    log_probs, entropy = token_logprobs(logits, labels, temperature, calculate_entropy)
    log_probs = gather_sequence(log_probs, sp)[packed.sources]
    if entropy is not None:
        entropy = gather_sequence(entropy, sp)[packed.sources]
    return log_probs, entropy


def ulysses_values(model: torch.nn.Module, packed: Packed, sp: SequenceParallel
                   ) -> torch.Tensor:
    """Values ``[K]`` as ``packed_values`` gives them, computed by the group together."""
    ids, pos, _, forward = split_packed(packed, sp)
    values = model(input_ids=ids, attention_mask=None, position_ids=pos, use_cache=False,
                   **{KWARG: forward})
    return gather_sequence(values[0], sp)[packed.sources]


def widen_token_budgets(role: Any, sp: Optional[SequenceParallel]) -> None:
    """As in verl, a token budget (``*_max_token_len_per_gpu``) counts the tokens one rank
    holds; a group of s ranks splits each micro-batch s ways, so a micro-batch may hold s
    times the budget. ``role``: a DataParallelPPOActor or DataParallelPPOCritic (or None)."""
    if sp is None or role is None:
        return

    def widened(limit: Optional[TokenBudget]) -> Optional[TokenBudget]:
        if limit is None:
            return None
        return dataclasses.replace(limit, max_tokens=limit.max_tokens * sp.size,
                                   key=f"{limit.key} x ulysses_sequence_parallel_size")

    for name in ("log_prob_budget", "forward_budget"):
        if hasattr(role, name):
            setattr(role, name, widened(getattr(role, name)))
    settings = getattr(getattr(role, "updater", None), "settings", None)
    if settings is not None:
        settings.token_budget = widened(settings.token_budget)
