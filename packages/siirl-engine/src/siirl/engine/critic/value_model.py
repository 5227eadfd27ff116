"""The PPO value model: the policy's architecture with a scalar value head.

The critic loads the same causal LM as the actor (``critic.model``, which defaults to the
actor's path, so the built-in tiny model when that is None), keeps its backbone (the
decoder stack without the LM head) and puts a fresh ``nn.Linear(hidden_size, 1)`` on the
last hidden state. Starting from the policy's weights gives the critic the policy's
representation of the task; only the head starts from scratch.

Alignment (``response_values``): for ``input_ids`` ``[B, P+R]`` (prompts left-padded,
responses right-padded) the value of response token ``t`` is the head's output at
position ``P-1+t``, the position whose hidden state predicts token ``t`` - exactly the
positions ``siirl.engine.models.logprob.response_logprobs`` takes its logits from. So
``values[:, t]`` estimates the return of the state in which token ``t`` is chosen, which
is what GAE pairs with ``log_probs[:, t]`` and ``token_level_rewards[:, t]`` (verl does
the same: ``values[:, -R - 1:-1]``).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from siirl.engine.models.packing import Packed
from siirl.errors import ConfigError

__all__ = ["ValueModel", "build_value_model", "packed_values", "response_values",
           "value_model_from_lm"]


def _hidden_states(output: Any) -> torch.Tensor:
    """The last hidden state of an HF base-model output, a tuple, or a bare tensor."""
    if isinstance(output, torch.Tensor):
        return output
    hidden = getattr(output, "last_hidden_state", None)
    return hidden if hidden is not None else output[0]


class ValueModel(torch.nn.Module):
    """``backbone`` (token ids -> hidden states ``[B, T, H]``) plus a linear value head.

    ``forward`` returns one fp32 value per position, ``[B, T]``. The head runs outside
    autocast: with a bf16 backbone the values (and the value loss) stay in fp32.
    ``_no_split_modules`` is taken from the causal LM so FSDP2 shards the same decoder
    layers as it does for the actor.
    """

    def __init__(self, backbone: torch.nn.Module, hidden_size: int, *,
                 no_split_modules: Iterable[str] = (), init_std: float = 0.02,
                 seed: int = 0):
        super().__init__()
        self.backbone = backbone
        self.value_head = torch.nn.Linear(int(hidden_size), 1)
        self._no_split_modules = list(no_split_modules)
        # Seeded, so every data-parallel rank (and a re-run) starts from the same head.
        generator = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            weight = torch.empty(self.value_head.weight.shape, dtype=torch.float32)
            weight.normal_(0.0, float(init_std), generator=generator)
            self.value_head.weight.copy_(weight)
            self.value_head.bias.zero_()
        param = next(backbone.parameters(), None)
        if param is not None:
            self.value_head.to(device=param.device, dtype=param.dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None, use_cache: bool = False,
                **kwargs: Any) -> torch.Tensor:
        # kwargs reach the backbone's attention (Ulysses sequence parallelism passes its
        # context that way)
        output = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=position_ids, use_cache=use_cache, **kwargs)
        hidden = _hidden_states(output)
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            head_dtype = self.value_head.weight.dtype
            return self.value_head(hidden.to(head_dtype)).squeeze(-1).float()


def response_values(model: torch.nn.Module, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor, position_ids: torch.Tensor,
                    response_length: int) -> torch.Tensor:
    """Values ``[B, R]`` of the last ``R`` tokens of ``input_ids`` (see the module
    docstring for the alignment). Gradients flow; padded response positions hold values
    that mean nothing: mask them with ``response_mask``."""
    resp = int(response_length)
    if resp <= 0:
        return input_ids.new_zeros((input_ids.shape[0], 0), dtype=torch.float32)
    values = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids, use_cache=False)
    return values[:, -resp - 1:-1]


def packed_values(model: torch.nn.Module, packed: Packed) -> torch.Tensor:
    """Values ``[K]`` of the scored response tokens of packed rows
    (``siirl.engine.models.packing``), at the same positions as :func:`response_values`:
    one forward over ``[1, T]`` tokens, no attention mask."""
    values = model(input_ids=packed.input_ids, attention_mask=None,
                   position_ids=packed.position_ids, use_cache=False)
    return values[0, packed.sources]


def _backbone_of(lm: torch.nn.Module) -> torch.nn.Module:
    backbone = getattr(lm, "base_model", None)
    if not isinstance(backbone, torch.nn.Module) or backbone is lm:
        raise ConfigError(f"critic.model: {type(lm).__name__} exposes no base model (decoder "
                          "without LM head) to put a value head on")
    return backbone


def _hidden_size(lm: torch.nn.Module) -> int:
    config = getattr(lm, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()  # multimodal configs nest the LM's
    size = getattr(config, "hidden_size", None)
    if size is None:
        raise ConfigError(f"critic.model: cannot tell the hidden size of {type(lm).__name__}")
    return int(size)


def value_model_from_lm(lm: torch.nn.Module, seed: int = 0) -> ValueModel:
    """A ValueModel on ``lm``'s backbone; the LM head is dropped (a head tied to the input
    embeddings keeps living as those embeddings)."""
    config = getattr(lm, "config", None)
    return ValueModel(_backbone_of(lm), _hidden_size(lm),
                      no_split_modules=getattr(lm, "_no_split_modules", None) or (),
                      init_std=float(getattr(config, "initializer_range", 0.02) or 0.02),
                      seed=seed)


def build_value_model(model_cfg: Any, seed: int = 0, dtype: Any = torch.float32,
                      device_type: str = "cpu") -> ValueModel:
    """Load ``model_cfg`` (``critic.model``) with the policy loader and wrap it
    (``device_type``: where it will train)."""
    from siirl.engine.models.loader import load_model

    return value_model_from_lm(load_model(model_cfg, dtype=dtype, device_type=device_type),
                               seed=seed)
