"""The megatron engines' LoRA wiring (``actor_rollout_ref.model.lora_rank > 0``): adapters on
the actor's GPT stage, and the reference as that same stage with its adapters off (the
frozen base weights are the initial policy, so no second model is built)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from siirl.engine.common.config import run_seed
from siirl.engine.megatron.lora import (
    LoraSettings,
    adapters_disabled,
    add_adapters,
    settings_of,
)
from siirl.engine.models.lora import lora_enabled


def attach(cfg: Any, model: torch.nn.Module, hf_config: Any) -> Optional[LoraSettings]:
    """Freeze ``model`` and give it the run's adapters (seeded by ``trainer.seed``: the same
    on every rank and in a resumed run); None without LoRA."""
    model_cfg = cfg.actor_rollout_ref.model
    if not lora_enabled(model_cfg):
        return None
    settings = settings_of(model_cfg)
    add_adapters(model, hf_config, settings, seed=run_seed(cfg))
    return settings


def shares_actor_base(actor: Any) -> bool:
    """Whether ``actor`` is a megatron LoRA actor (its stage with adapters off is the
    reference)."""
    return isinstance(getattr(getattr(actor, "backend", None), "lora", None), LoraSettings)


def adapters_off(actor: Any) -> Callable[[], Any]:
    """The context the reference's schedule runs in: the actor's adapters off on every
    pipeline stage and chunk (a head runs on the last stage only)."""
    model = actor.backend.schedule_model
    return lambda: adapters_disabled(model)
