"""The KV cache's name in a model's call and output, per transformers version.

transformers 5 renamed the argument and output field ``past_key_values`` to ``cache``; the
old name still works there, but logs a deprecation warning (once per process, so on every
run). The decoding loops pass and read whichever name the model takes.
"""

from __future__ import annotations

from typing import Any

import torch

from siirl.engine.models.logprob import accepts_kwarg

__all__ = ["cache_argument", "output_cache"]


def cache_argument(module: torch.nn.Module) -> str:
    """The keyword ``module``'s forward takes its KV cache by."""
    return "cache" if accepts_kwarg(module, "cache") else "past_key_values"


def output_cache(output: Any) -> Any:
    """The KV cache a forward returned (transformers 5: ``cache``, before: ``past_key_values``;
    modules of our own or the user's may return either)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values
