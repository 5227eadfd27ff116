"""OpenVLA-style action tokens: each action dimension in ``[low, high]`` is cut into
``bins`` uniform bins, and bin ``i`` (0-based) is token ``vocab_size - 1 - i``, the last
``bins`` ids of the vocabulary (rarely used tokens in a language model's vocabulary).

An action chunk ``[k, D]`` is ``k * D`` tokens, dimension by dimension, action by action.
Decoding maps a token to its bin's centre, so encode -> decode moves a value by at most half
a bin. For the policy gradient the model's next-token distribution is restricted to the
action tokens (every other logit is ``-inf``), sampled at a temperature, and its log-probs
are those of the restricted distribution, the same in the rollout and in training.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from siirl.errors import ConfigError


class ActionTokenizer:
    """Continuous actions <-> the last ``bins`` token ids of a ``vocab_size`` vocabulary.

    ``reserved``: ids at the start of the vocabulary the bins must not overlap (pad, BOS,
    EOS, the instruction's words); a vocabulary too small for both is a ConfigError at
    start, not a policy that emits special tokens as actions.
    """

    def __init__(self, vocab_size: int, bins: int = 256, low: float = -1.0, high: float = 1.0,
                 reserved: int = 0):
        self.vocab_size, self.bins = int(vocab_size), int(bins)
        self.low, self.high = float(low), float(high)
        if self.bins < 2 or not self.high > self.low:
            raise ConfigError(f"action bins need bins >= 2 and high > low, got bins={bins}, "
                              f"low={low}, high={high}")
        if self.vocab_size - self.bins < int(reserved):
            raise ConfigError(
                f"the model's vocabulary ({self.vocab_size} tokens) cannot hold {self.bins} "
                f"action bins after its {reserved} reserved tokens; use a model with at "
                f"least {int(reserved) + self.bins} tokens or fewer bins")
        self.edges = np.linspace(self.low, self.high, self.bins + 1)
        self.centres = (self.edges[:-1] + self.edges[1:]) / 2

    @property
    def first_id(self) -> int:
        """The smallest action token id."""
        return self.vocab_size - self.bins

    def encode(self, actions: np.ndarray) -> np.ndarray:
        """Token ids of ``actions`` (any shape; values clipped into ``[low, high]``)."""
        values = np.clip(np.asarray(actions, dtype=np.float64), self.low, self.high)
        index = np.clip(np.searchsorted(self.edges, values, side="right") - 1, 0,
                        self.bins - 1)
        return (self.vocab_size - 1 - index).astype(np.int64)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """Bin centres of action ``tokens`` (float32); a non-action token is a ValueError."""
        tokens = np.asarray(tokens, dtype=np.int64)
        index = self.vocab_size - 1 - tokens
        outside = (index < 0) | (index >= self.bins)
        if outside.any():
            raise ValueError(f"not an action token (ids {self.first_id}..."
                             f"{self.vocab_size - 1}): {tokens[outside][:5]}")
        return self.centres[index].astype(np.float32)

    def chunk(self, tokens: np.ndarray, action_dim: int) -> np.ndarray:
        """``k * action_dim`` tokens as the action chunk ``[k, action_dim]``."""
        values = self.decode(tokens)
        if values.size % action_dim:
            raise ValueError(f"{values.size} action tokens do not make whole actions of "
                             f"{action_dim} dimensions")
        return values.reshape(-1, action_dim)

    # ---- the policy's distribution over action tokens ------------------------------

    def restrict(self, logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """``logits [..., vocab]`` with every non-action token at ``-inf``, divided by
        ``temperature``."""
        out = torch.full_like(logits, float("-inf"))
        out[..., self.first_id:self.vocab_size] = logits[..., self.first_id:self.vocab_size]
        return out / max(float(temperature), 1e-6)

    def log_probs(self, logits: torch.Tensor, tokens: torch.Tensor,
                  temperature: float = 1.0) -> torch.Tensor:
        """Log-probs of action ``tokens [...]`` under the restricted distribution of
        ``logits [..., vocab]`` (differentiable: the PPO/GRPO losses take them)."""
        log_softmax = torch.log_softmax(self.restrict(logits.float(), temperature), dim=-1)
        return log_softmax.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)

    def sample(self, logits: torch.Tensor, temperature: float = 1.0,
               generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Action tokens drawn from ``logits [..., vocab]`` (greedy at temperature 0)."""
        restricted = self.restrict(logits.float(), temperature if temperature > 0 else 1.0)
        if temperature <= 0:
            return restricted.argmax(-1)
        probs = torch.softmax(restricted, dim=-1)
        flat = probs.reshape(-1, probs.shape[-1])
        drawn = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
        return drawn.reshape(probs.shape[:-1])
