"""Training dtype of the megatron roles (``<role>.megatron.dtype``): the parameters and the
compute in bf16 or fp16 with fp32 main copies in megatron's mixed-precision optimizers, or
fp32. fp16 adds megatron's dynamic loss scaling (:data:`LOSS_SCALING`): the loss is
multiplied by the scale before every backward (the model config's ``grad_scale_func``), the
optimizer unscales the gradients and skips the step when any is inf or NaN, halving the
scale after ``hysteresis`` such steps and doubling it after ``loss_scale_window`` clean
ones.

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
from siirl.errors import ConfigError
from siirl.params.sections import own_engine_rollout

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# megatron's DynamicGradScaler settings (OptimizerConfig keys) for fp16; the initial scale
# is torch.amp.GradScaler's 2**16 rather than megatron's 2**32, which skips the first ~16
# steps of a run while it backs off
LOSS_SCALING = dict(initial_loss_scale=2.0**16, min_loss_scale=1.0, loss_scale_window=1000,
                    hysteresis=2)


def params_dtype(name: Any, key: str) -> torch.dtype:
    """The torch dtype of ``<role>.megatron.dtype`` (``key`` names it in the error)."""
    text = str(name)
    if text not in DTYPES:
        raise ConfigError(f"{key}={text!r}: must be one of {', '.join(DTYPES)}")
    return DTYPES[text]


def with_main_params(optimizer: torch.optim.Optimizer, dtype: torch.dtype,
                     overrides: Optional[dict] = None) -> Any:
    """``optimizer`` unchanged for fp32 weights; for bf16 ones megatron's
    ``Float16OptimizerWithFloat16Params`` around it (fp32 main copies of the bf16 parameters
    in its param groups; fp32 parameters such as the critic's value head stay as they are).
    Its ``clip_grad`` is 0: the caller clips the model's gradients (over TP and PP) before
    ``step()``, as for the fp32 optimizer. Gradients accumulate in the bf16 ``.grad`` over
    micro-batches (no DDP buffers here), then are copied to fp32 for the update. fp16: its
    grad scaler from :data:`LOSS_SCALING` with ``overrides`` (OptimizerConfig fields:
    ``loss_scale`` fixes the scale)."""
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
    fp16 = dtype == torch.float16
    config = OptimizerConfig(bf16=not fp16, fp16=fp16, params_dtype=dtype, clip_grad=0.0,
                             lr=optimizer.param_groups[0]["lr"],
                             **({**LOSS_SCALING, **(overrides or {})} if fp16 else {}))
    scaler = _grad_scaler(config) if fp16 else None
    wrapped = Float16OptimizerWithFloat16Params(optimizer, config, scaler, _no_state)
    wrapped.torch_optimizer = optimizer  # the lr schedule drives its (shared) param groups
    return wrapped


def _grad_scaler(config: Any) -> Any:
    """Megatron's grad scaler for ``config`` (as its ``get_megatron_optimizer`` builds it)."""
    from megatron.core.optimizer.grad_scaler import ConstantGradScaler, DynamicGradScaler

    if config.loss_scale:
        return ConstantGradScaler(config.loss_scale)
    return DynamicGradScaler(initial_scale=config.initial_loss_scale,
                             min_scale=config.min_loss_scale, growth_factor=2.0,
                             backoff_factor=0.5, growth_interval=config.loss_scale_window,
                             hysteresis=config.hysteresis)


def loss_scaler(optimizer: Any) -> Any:
    """The megatron optimizer behind ``optimizer`` when it scales the loss (fp16), else
    None (its ``scale_loss`` then goes into the model config's ``grad_scale_func``)."""
    megatron = getattr(optimizer, "megatron", optimizer)  # MegatronOptimizer wraps one
    # megatron chains its optimizers (one per parameter kind): the first one's scale is the
    # chain's (get_loss_scale), and on an MoE model every one's (joint_loss_scale)
    first = getattr(megatron, "chained_optimizers", [megatron])[0]
    return megatron if getattr(first, "grad_scaler", None) is not None else None


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
