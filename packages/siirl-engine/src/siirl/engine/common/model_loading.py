"""Loading the run's models (fp32, on the run's device) for any backend."""

from __future__ import annotations

from typing import Any, Tuple

import torch

from siirl.engine.common.runtime import resolve_device
from siirl.engine.models.loader import load_model_and_tokenizer
from siirl.params import SiiRLArguments


def load_policy(cfg: SiiRLArguments) -> Tuple[torch.nn.Module, Any]:
    """(model of ``actor_rollout_ref.model`` in fp32 on the run's device, tokenizer)."""
    device = resolve_device(cfg)
    module, tokenizer = load_model_and_tokenizer(cfg.actor_rollout_ref.model,
                                                 dtype=torch.float32, device_type=device.type)
    return module.to(device), tokenizer
