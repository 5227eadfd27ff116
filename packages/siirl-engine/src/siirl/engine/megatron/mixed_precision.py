"""Training dtype of the megatron roles (``<role>.megatron.dtype``): the parameters and the
compute in bf16 with fp32 main copies in megatron's mixed-precision optimizers, or fp32.

The actor's megatron DDP + (distributed) optimizer picks the mixed-precision path from the
parameters' dtype (:mod:`siirl.engine.megatron.optimizer`). The optimizers that stay torch
AdamW (the critic, whose value head sits outside the GPTModel megatron's DDP wraps, and an
actor with virtual pipeline stages) get megatron's ``Float16OptimizerWithFloat16Params``
around them here: fp32 copies of the bf16 weights, Adam steps those and copies them back.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from siirl.engine.common.rollout_dtype import engine_dtype
from siirl.engine.megatron.config import FP16_REFUSED
from siirl.errors import ConfigError
from siirl.params.sections import own_engine_rollout

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def params_dtype(name: Any, key: str) -> torch.dtype:
    """The torch dtype of ``<role>.megatron.dtype`` (``key`` names it in the error)."""
    text = str(name)
    if text == "float16":
        raise ConfigError(f"{key}=float16: {FP16_REFUSED}")
    if text not in DTYPES:
        raise ConfigError(f"{key}={text!r}: must be one of {', '.join(DTYPES)}")
    return DTYPES[text]


def with_main_params(optimizer: torch.optim.Optimizer, dtype: torch.dtype) -> Any:
    """``optimizer`` unchanged for fp32 weights; for bf16 ones megatron's
    ``Float16OptimizerWithFloat16Params`` around it (fp32 main copies of the bf16 parameters
    in its param groups; fp32 parameters such as the critic's value head stay as they are).
    Its ``clip_grad`` is 0: the caller clips the model's gradients (over TP and PP) before
    ``step()``, as for the fp32 optimizer. Gradients accumulate in the bf16 ``.grad`` over
    micro-batches (no DDP buffers here), then are copied to fp32 for the update."""
    if dtype == torch.float32:
        return optimizer
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer import (
        Float16OptimizerWithFloat16Params,
        param_group_identifier_keys,
    )

    # megatron's load_state_dict matches saved and current groups by the keys its own
    # groups carry; torch AdamW's one group gets their neutral values (torch ignores them)
    neutral = {"wd_mult": 1.0, "lr_mult": 1.0, "is_expert_parallel": False,
               "is_decoupled_lr": False}
    for group in optimizer.param_groups:
        for key in param_group_identifier_keys:
            group.setdefault(key, neutral[key])
    config = OptimizerConfig(bf16=True, params_dtype=dtype, clip_grad=0.0,
                             lr=optimizer.param_groups[0]["lr"])
    wrapped = Float16OptimizerWithFloat16Params(optimizer, config, None, _no_state)
    wrapped.torch_optimizer = optimizer  # the lr schedule drives its (shared) param groups
    return wrapped


def _no_state(optimizer: torch.optim.Optimizer, config: Optional[Any] = None) -> None:
    """Megatron's ``init_state_fn`` (called before loading into a fresh optimizer): torch's
    AdamW loads its whole state from the checkpoint, nothing to prepare."""


def rollout_weight_dtype(cfg: Any, trained: torch.dtype) -> torch.dtype:
    """The dtype the weight sync sends to the rollout: a server rollout's ``rollout.dtype``
    (vLLM / SGLang load into a model of that dtype), else (the ``hf`` rollout, which copies
    into its own module, or ``dtype=auto``) the dtype the weights are trained in."""
    if not own_engine_rollout(cfg):
        return trained
    name = engine_dtype(cfg.actor_rollout_ref.rollout)
    return trained if name == "auto" else getattr(torch, name)
