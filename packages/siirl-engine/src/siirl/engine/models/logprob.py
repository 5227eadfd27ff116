"""Per-token log-probs (and entropy) of the response part of prompt+response sequences.

Shared by the actor, reference and rollout code so that every log-prob in a step is
computed the same way (same temperature scaling, same float32 softmax).
"""

from __future__ import annotations

import inspect
from functools import lru_cache

import torch

from siirl.engine.models.packing import Packed

__all__ = ["accepts_kwarg", "logprobs_from_logits", "packed_logprobs", "response_logprobs",
           "token_logprobs"]


@lru_cache(maxsize=64)
def _forward_params(cls: type) -> tuple[frozenset, bool]:
    try:
        params = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return frozenset(), False
    varkw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return frozenset(params), varkw


def accepts_kwarg(model: torch.nn.Module, name: str) -> bool:
    """Whether ``model.forward`` names ``name``; looks through wrappers (FSDP1, DDP, peft)
    whose forward passes ``**kwargs`` on to the wrapped module."""
    for _ in range(4):
        names, varkw = _forward_params(type(model))
        if name in names:
            return True
        inner = getattr(model, "module", None) or getattr(model, "_fsdp_wrapped_module", None)
        if inner is None and callable(getattr(model, "get_base_model", None)):
            inner = model.get_base_model()  # peft's PeftModel
        if not varkw or not isinstance(inner, torch.nn.Module):
            return False
        model = inner
    return False


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    **model_inputs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(log_probs [B, R], entropy [B, R] or None)`` for the last ``R`` tokens of
    ``input_ids`` ([B, P+R], prompts left-padded, responses right-padded).

    One forward pass; the logits at positions P-1 .. P+R-2 (which predict the response
    tokens) are divided by ``temperature`` and log-softmaxed in float32. Positions are
    passed explicitly, so left padding does not shift them. Gradients flow (the actor's
    loss uses this); wrap in ``torch.no_grad()`` for old/ref log-probs. Values at padded
    response positions are defined but meaningless: mask them with ``response_mask``.
    """
    if temperature <= 0:
        raise ValueError(f"response_logprobs needs temperature > 0, got {temperature}")
    resp = int(response_length)
    if resp <= 0:
        empty = input_ids.new_zeros((input_ids.shape[0], 0), dtype=torch.float32)
        return empty, (empty.clone() if calculate_entropy else None)
    kwargs = {}
    if accepts_kwarg(model, "logits_to_keep"):
        # The LM head then runs on R+1 positions only: no [B, P+R, V] logits tensor.
        kwargs["logits_to_keep"] = resp + 1
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids, use_cache=False, **kwargs, **model_inputs)
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logprobs_from_logits(logits, input_ids, resp, temperature, calculate_entropy)


def logprobs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor, resp: int,
                         temperature: float = 1.0, calculate_entropy: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The response part of :func:`response_logprobs` for logits ``[B, >=R+1, V]`` whose
    last positions line up with ``input_ids``' (any model's forward)."""
    # Keep positions P-1 .. P+R-2: the last R+1 minus the final one (it predicts past the end).
    return token_logprobs(logits[:, -resp - 1:-1, :], input_ids[:, -resp:], temperature,
                          calculate_entropy)


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                   calculate_entropy: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``labels`` ``[...]`` under ``logits`` ``[..., V]`` / ``temperature``
    (float32 softmax), and the entropy there; the one formula of every log-prob path."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = logits.log_softmax(dim=-1)
    log_probs = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if calculate_entropy:
        entropy = -(logp.exp() * logp).sum(dim=-1)
    return log_probs, entropy


def packed_logprobs(model: torch.nn.Module, packed: Packed, temperature: float = 1.0,
                    calculate_entropy: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(log_probs [K], entropy [K] or None)`` of the scored response tokens of packed rows
    (``siirl.engine.models.packing``): one forward over ``[1, T]`` tokens, no attention
    mask (transformers keeps the sequences apart by their restarting positions)."""
    if temperature <= 0:
        raise ValueError(f"packed_logprobs needs temperature > 0, got {temperature}")
    kwargs = {}
    if accepts_kwarg(model, "logits_to_keep"):
        # an index tensor: the LM head runs on the K scored positions only
        kwargs["logits_to_keep"] = packed.sources
    out = model(input_ids=packed.input_ids, attention_mask=None,
                position_ids=packed.position_ids, use_cache=False, **kwargs)
    logits = (out.logits if hasattr(out, "logits") else out[0])[0]
    if not kwargs:
        logits = logits[packed.sources]
    return token_logprobs(logits, packed.labels, temperature, calculate_entropy)
