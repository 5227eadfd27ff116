"""``rollout.dtype`` as the inference engines name it: read by the rollouts (the engine's
model dtype) and by the training backends (the dtype their weight sync sends)."""

from __future__ import annotations

from typing import Any

from siirl.errors import ConfigError

ROLLOUT = "actor_rollout_ref.rollout"
DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16",
          "float16": "float16", "half": "float16", "fp32": "float32", "float32": "float32",
          "float": "float32", "auto": "auto"}


def engine_dtype(rollout: Any) -> str:
    """``rollout.dtype`` as the engines name it (bfloat16, float16, float32, auto)."""
    dtype = DTYPES.get(str(rollout.dtype).lower())
    if dtype is None:
        raise ConfigError(f"{ROLLOUT}.dtype={rollout.dtype!r} is not supported; use one of "
                          f"{', '.join(sorted(set(DTYPES)))}")
    return dtype
