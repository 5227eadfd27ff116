"""Sequence packing (verl's ``use_remove_padding``): a micro-batch's attended tokens run as
one row, ``[1, total_tokens]``, with no pad token in the forward at all.

Each sequence keeps its own positions, which restart at 0 where it begins. Given such
``position_ids`` and no attention mask, transformers (5.x) treats the row as packed
sequences: flash-attention-2 runs its varlen kernels on them, and sdpa/eager/flex get a
block-diagonal causal mask from ``transformers.masking_utils`` (its packed-sequence
detection), so no token attends across a sequence boundary. A model whose code does not
build its masks with those utilities (``trust_remote_code`` models) would attend across
them, so such a model runs padded (with a warning).

Only the outputs the caller reads are kept: for response token ``t`` of a row, the output
at the position of the token before it (the logits predicting it, the value of choosing
it). They are put back at ``[row, t]`` of a ``[B, R]`` tensor; every other position holds
0, as ``siirl.engine.models.padding.on_used_columns`` leaves it.
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

__all__ = ["Packed", "on_packed", "pack", "packs_natively", "unpack"]

logger = logging.getLogger(__name__)
_warned: set = set()


class Packed(NamedTuple):
    input_ids: torch.Tensor  # [1, T] every row's attended tokens, one row after the other
    position_ids: torch.Tensor  # [1, T] each sequence's own positions, from 0
    sources: torch.Tensor  # [K] packed position whose output belongs to a response token
    labels: torch.Tensor  # [K] that response token (what the logits there predict)
    targets: torch.Tensor  # [K] its flat index in the [rows, response_length] outputs
    shape: Tuple[int, int]  # (rows, response_length)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
         response_length: int) -> Optional[Packed]:
    """The packed form of ``[B, P+R]`` rows (prompts left-padded, responses right-padded),
    or None where packing would not give the padded forward's outputs: a row whose
    attended tokens are not one contiguous run, positions that are not ``cumsum(mask)-1``
    on them (3-D rope positions, offsets), or no response token to score at all."""
    resp = int(response_length)
    if input_ids.dim() != 2 or position_ids.shape != input_ids.shape:
        return None
    rows, width = input_ids.shape
    if not 0 < resp <= width:
        return None
    mask = attention_mask.ne(0)
    before = F.pad(mask[:, :-1], (1, 0), value=False)  # is the column to the left attended
    runs = (mask & ~before).sum(-1)
    # transformers tells sequences apart by positions that do not step by 1
    steady = position_ids.eq(mask.cumsum(-1) - 1) | ~mask
    if not bool((runs <= 1).all() & steady.all()):  # one host sync for both checks
        return None
    flat = mask.reshape(-1)
    index = (flat.cumsum(0) - 1).view(rows, width)  # packed position of each attended token
    prompt = width - resp
    # response tokens whose predecessor is attended: their logits/value exist in the pack
    scored = mask[:, prompt:] & before[:, prompt:]
    sources = F.pad(index[:, :-1], (1, 0))[:, prompt:][scored]
    if sources.numel() == 0:
        return None  # nothing to score: the padded path still gives the loss a graph
    return Packed(input_ids=input_ids.reshape(-1)[flat].unsqueeze(0),
                  position_ids=position_ids.reshape(-1)[flat].unsqueeze(0),
                  sources=sources, labels=input_ids[:, prompt:][scored],
                  targets=scored.reshape(-1).nonzero().squeeze(-1), shape=(rows, resp))


def unpack(values: Optional[torch.Tensor], packed: Packed) -> Optional[torch.Tensor]:
    """``values`` ``[K]`` (one per scored response token) as ``[rows, response_length]``,
    0 elsewhere; gradients flow back to ``values``."""
    if values is None:
        return None
    rows, resp = packed.shape
    out = values.new_zeros(rows * resp)
    return out.index_copy(0, packed.targets, values).view(rows, resp)


def _transformers_model(module: torch.nn.Module) -> Optional[torch.nn.Module]:
    from transformers import PreTrainedModel

    # the first one: the model itself, or the one inside a wrapper (peft, a value model)
    return next((m for m in module.modules() if isinstance(m, PreTrainedModel)), None)


def packs_natively(module: torch.nn.Module) -> bool:
    """Whether ``module`` is (or wraps) a model of transformers' own code, whose attention
    keeps packed sequences apart by their positions."""
    model = _transformers_model(module)
    return model is not None and any(
        cls.__module__.startswith("transformers.models.") for cls in type(model).__mro__)


def on_packed(fn: Callable[[torch.nn.Module, Packed], Dict[str, Optional[torch.Tensor]]],
              module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              position_ids: torch.Tensor, response_length: int,
              ) -> Optional[Dict[str, Optional[torch.Tensor]]]:
    """``fn(module, packed)`` (outputs ``[K]``, one per scored response token) on the packed
    rows, outputs as ``[B, response_length]``; None where the rows do not pack (see
    :func:`pack`) or the model cannot run them packed: run them padded then."""
    if not packs_natively(module):
        name = type(_transformers_model(module) or module).__name__
        if name not in _warned:
            _warned.add(name)
            logger.warning("use_remove_padding: %s is not a transformers model, whose "
                           "attention is known to keep packed sequences apart; it runs on "
                           "padded rows", name)
        return None
    packed = pack(input_ids, attention_mask, position_ids, response_length)
    if packed is None:
        return None
    return {name: unpack(value, packed) for name, value in fn(module, packed).items()}
