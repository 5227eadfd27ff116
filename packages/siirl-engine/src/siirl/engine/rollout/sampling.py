"""Next-token choice from last-position logits: greedy, or temperature / top-k / top-p
sampling, each row driven by its own noise (``keyed_random``) or by torch's global RNG."""

from __future__ import annotations

import torch

__all__ = ["sample_next_token"]


def sample_next_token(logits: torch.Tensor, greedy: bool, temperature: float = 1.0,
                      top_k: int = -1, top_p: float = 1.0,
                      noise: torch.Tensor | None = None) -> torch.Tensor:
    """Next token ids [B] from last-position logits [B, V] (float32 math).

    ``noise`` (uniforms [B] in [0, 1)) picks each row's token by inverting its cumulative
    distribution, so a row's choice depends on its own noise only; without it, tokens are
    drawn with ``torch.multinomial`` from the global RNG.
    """
    if greedy:
        return logits.argmax(dim=-1)
    logits = logits.float()
    if temperature != 1.0:  # x / 1.0 == x exactly: skip the copy
        logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # drop a token once the mass before it already reaches top_p (the top one stays)
        drop = (probs.cumsum(dim=-1) - probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    if noise is None:
        return torch.multinomial(probs, 1).squeeze(-1)
    cdf = probs.double().cumsum(dim=-1)
    target = noise.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]
    # the first token whose cumulative mass exceeds the target (never a zero-mass token);
    # the cdf never decreases, so a binary search counts the entries <= target
    picked = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return picked.clamp(max=logits.shape[-1] - 1)
