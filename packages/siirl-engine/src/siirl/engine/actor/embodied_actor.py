"""Log-probs of a vision-language-action policy over whole episodes.

An embodied episode is one row (``siirl.environment.embodied.rollout_node``): its prompt is
the instruction with the VLA's image and proprio placeholders, its response the ``T`` chunks'
action tokens side by side (``T * A`` tokens, ``A`` per chunk), and ``pixel_values`` /
``proprio`` hold one observation per chunk (``[B, T, ...]``). The policy sees one
observation at a time, as in the rollout, so each chunk is its own forward sequence:
``prompt + that chunk's A tokens`` with that chunk's image. Chunks past the episode's end
(response mask 0) are not run at all; their outputs are 0.

The outputs have the usual ``[B, T * A]`` layout, so the PPO/GRPO losses, masks and
advantages of text rows apply unchanged.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    PIXEL_VALUES,
    PROPRIO,
    RESPONSES,
)
from siirl.engine.models.logprob import logprobs_from_logits


def is_episode_batch(micro: Any) -> bool:
    """Rows whose observations come per chunk (``pixel_values`` ``[B, T, H, W, 3]``)."""
    return PIXEL_VALUES in micro.keys() and micro[PIXEL_VALUES].dim() == 5


def episode_logprobs(module: torch.nn.Module, micro: Any, temperature: float,
                     calculate_entropy: bool) -> Dict[str, Optional[torch.Tensor]]:
    """``{"log_probs": [B, T*A], "entropy": [B, T*A] or None}`` for episode rows."""
    ids, mask = micro[INPUT_IDS], micro[ATTENTION_MASK]
    pixels = micro[PIXEL_VALUES]
    rows, steps = pixels.shape[:2]
    width = micro[RESPONSES].shape[-1]
    if width % steps:
        raise ValueError(f"an episode row's {width} response tokens do not split into its "
                         f"{steps} chunk observations")
    per_chunk = width // steps
    prompt, prompt_mask = ids[:, :-width], mask[:, :-width]
    actions = ids[:, -width:].reshape(rows, steps, per_chunk)
    # a chunk was played when its first action token is in the attention mask
    played = mask[:, -width:].reshape(rows, steps, per_chunk)[..., 0] > 0
    row_index, step_index = played.nonzero(as_tuple=True)
    if row_index.numel() == 0:  # padding rows only: still one forward (collectives pair up)
        row_index = step_index = torch.zeros(1, dtype=torch.long, device=ids.device)
    sequences = torch.cat([prompt[row_index], actions[row_index, step_index]], dim=1)
    attention = torch.cat([prompt_mask[row_index],
                           prompt_mask.new_ones((row_index.numel(), per_chunk))], dim=1)
    positions = (attention.long().cumsum(dim=1) - 1).clamp(min=0)
    extras = {PIXEL_VALUES: pixels[row_index, step_index]}
    if PROPRIO in micro.keys():
        extras[PROPRIO] = micro[PROPRIO][row_index, step_index]
    out = module(input_ids=sequences, attention_mask=attention, position_ids=positions,
                 use_cache=False, logits_to_keep=per_chunk + 1, **extras)
    logits = out.logits if hasattr(out, "logits") else out[0]
    log_probs, entropy = logprobs_from_logits(logits, sequences, per_chunk, temperature,
                                              calculate_entropy)

    def widened(values: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if values is None:
            return None
        full = values.new_zeros((rows, steps, per_chunk))
        if played.any():
            full = full.index_put((row_index, step_index), values)
        else:  # the dummy forward's outputs count for nothing, but keep the graph
            full = full + 0.0 * values.sum()
        return full.reshape(rows, width)

    return {"log_probs": widened(log_probs), "entropy": widened(entropy)}
