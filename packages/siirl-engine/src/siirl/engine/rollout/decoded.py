"""What the decoding loops (``sampler.decode``, ``reference.reference_decode``) return
when a partial rollout may pause them: its own module, so both loops share it without
importing each other."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Decoded(NamedTuple):
    """``decode``'s result when it was given ``pause``."""

    tokens: torch.Tensor  # long [B, T]: as without ``pause``
    log_probs: torch.Tensor | None  # float32 [B, T] with ``with_log_probs``, else None
    # bool [B]: rows the pause stopped before they emitted EOS or reached max_new_tokens;
    # each has all T tokens (rows decode in lockstep)
    unfinished: torch.Tensor
