"""Packing (``actor_rollout_ref.model.use_remove_padding``) under megatron without
Transformer Engine.

megatron-core's own packed sequences (THD, ``PackedSeqParams``) need TE's attention; the
local attention takes a ``[B, 1, S, S]`` mask only. So a micro-batch's attended tokens run as
one row ``[1, T]`` (:func:`siirl.engine.models.packing.pack`, as the fsdp path packs) with a
block-diagonal causal mask -- no token attends across a sequence boundary -- and each
sequence's own positions (RoPE from ``position_ids``). Only the scored response tokens'
logits are kept and put back at ``[row, t]`` of a ``[B, R]`` tensor, 0 elsewhere, as on
fsdp. Rows that do not pack run padded.
"""

from __future__ import annotations

from typing import Any, Dict

import torch

from siirl.data_coordinator.fields import ATTENTION_MASK, INPUT_IDS, POSITION_IDS
from siirl.engine.megatron.model import megatron_attention_mask, unwrap_model
from siirl.engine.models.logprob import token_logprobs
from siirl.engine.models.packing import pack, unpack

SEGMENTS = "segment_ids"  # [1, T]: the row (from 1) each packed token belongs to, 0 = filler
PACKED = "packed"  # the micro-batch's Packed (where its scored outputs go)
ROW_MASK = "row_mask"  # [B, S]: the padded rows' attention mask (packed token i = its i-th 1)


def pack_schedule_dict(micro: Dict[str, torch.Tensor], response_length: int,
                       sequence_multiple: int = 1) -> Dict[str, Any]:
    """A padded schedule dict as one packed row (or unchanged where its rows do not pack).
    With sequence parallelism the row is filled at the end to a multiple of the TP size
    with tokens of segment 0, which nothing attends to."""
    mask = micro[ATTENTION_MASK]
    packed = pack(micro[INPUT_IDS], mask, micro[POSITION_IDS], response_length)
    if packed is None:
        return micro
    rows = torch.arange(1, mask.shape[0] + 1, device=mask.device)[:, None].expand_as(mask)
    segments = rows[mask.ne(0)].unsqueeze(0)
    ids, positions = packed.input_ids, packed.position_ids
    extra = -ids.shape[1] % sequence_multiple
    if extra:
        ids, positions, segments = (torch.nn.functional.pad(t, (0, extra))
                                    for t in (ids, positions, segments))
    return {INPUT_IDS: ids, POSITION_IDS: positions, ATTENTION_MASK: segments.ne(0).long(),
            SEGMENTS: segments, PACKED: packed, ROW_MASK: mask}


def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """``[1, T]`` segment ids -> megatron's ``[1, 1, T, T]`` bool mask (True = masked out):
    causal within a segment, nothing across segments, no attending to filler (segment 0)."""
    query, key = segments[:, None, :, None], segments[:, None, None, :]
    length = segments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segments.device).triu(1)
    return causal[None, None] | query.ne(key) | key.eq(0)


def schedule_attention_mask(batch: Dict[str, Any]) -> torch.Tensor:
    """The megatron mask of a schedule dict, packed or padded."""
    if SEGMENTS in batch:
        return block_causal_mask(batch[SEGMENTS])
    return megatron_attention_mask(batch[ATTENTION_MASK])


def packed_logprobs(module: torch.nn.Module, batch: Dict[str, Any], temperature: float,
                    calculate_entropy: bool) -> Dict[str, Any]:
    """``log_probs`` (and ``entropy``) ``[B, R]`` of a packed schedule dict on the last
    stage: one forward over the packed row, log-softmax at the scored positions only."""
    packed = batch[PACKED]
    logits = module(batch[INPUT_IDS], batch[POSITION_IDS], block_causal_mask(batch[SEGMENTS]),
                    runtime_gather_output=True)[0]  # [T, Vpad]
    vocab_size = getattr(unwrap_model(module), "hf_vocab_size", None)
    scored = logits[packed.sources]
    if vocab_size is not None:
        scored = scored[:, :vocab_size]
    log_probs, entropy = token_logprobs(scored, packed.labels, temperature, calculate_entropy)
    return {"log_probs": unpack(log_probs, packed), "entropy": unpack(entropy, packed)}
