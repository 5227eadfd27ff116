"""Ulysses sequence parallelism (DeepSpeed-Ulysses) for transformers models under FSDP2.

``ulysses_sequence_parallel_size`` s groups s consecutive workers; they read the same rows,
and each runs the forward on 1/s of the packed sequence (``ulysses_forward``). Everything
but attention works token by token, so it runs on the slice as it is. Attention needs the
whole sequence: before it an all-to-all swaps "my tokens, every head" for "every token, my
1/s of the heads", attention runs on the whole sequence for those heads, and a second
all-to-all swaps back. So the query and key/value head counts must divide by s.

The attention functions transformers registers (``sdpa``, ``flash_attention_*``) are
wrapped once (:func:`install`); a wrapper does the exchange only when the forward carries
a :class:`UlyssesForward` under the keyword :data:`KWARG`, which transformers hands every
attention call (and gradient checkpointing replays with the layer). Any other forward (the
hf rollout's generation with the same module) calls the original function untouched.

The all-to-all is a permutation, so its backward is the reverse all-to-all; gloo has
``all_to_all`` in the torch this runs with (2.13), so CPU runs use the same path.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from siirl.errors import ConfigError

__all__ = ["KWARG", "SequenceParallel", "UlyssesForward", "all_to_all", "check_model",
           "gather_sequence", "install"]

KWARG = "siirl_ulysses"  # the forward keyword transformers passes on to attention
# attention implementations whose functions install() wraps
_SDPA, _FLASH = ("sdpa",), ("flash_attention_2", "flash_attention_3", "flash_attention_4")


class SequenceParallel:
    """This rank's sequence-parallel group: ``size`` ranks, this one at ``rank``."""

    def __init__(self, group: Any, size: int, rank: int):
        self.group, self.size, self.rank = group, int(size), int(rank)

    def __repr__(self) -> str:
        return f"SequenceParallel(rank={self.rank}/{self.size})"


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int):
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        size = dist.get_world_size(group)
        inputs = [t.contiguous() for t in x.chunk(size, dim=scatter_dim)]
        outputs = [torch.empty_like(inputs[0]) for _ in range(size)]
        dist.all_to_all(outputs, inputs, group=group)
        return torch.cat(outputs, dim=gather_dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scatter_dim, gather_dim = ctx.dims
        return _AllToAll.apply(grad, ctx.group, gather_dim, scatter_dim), None, None, None


def all_to_all(x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int
               ) -> torch.Tensor:
    """``x`` cut in equal parts along ``scatter_dim``, part i sent to rank i, the parts
    received joined along ``gather_dim`` in rank order (differentiable)."""
    return _AllToAll.apply(x, group, scatter_dim, gather_dim)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, sp: SequenceParallel, dim: int):
        ctx.sp, ctx.dim = sp, dim
        parts = [torch.empty_like(x) for _ in range(sp.size)]
        dist.all_gather(parts, x.contiguous(), group=sp.group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        sp = ctx.sp
        # Every rank of the group computes the same loss from the gathered tensor and
        # backpropagates only its own slice, so the group's gradients add up to the loss's
        # gradient once; FSDP then averages over all s x dp ranks where the data-parallel
        # loss scaling expects dp: the factor s puts that back (verl scales the same way).
        return grad.chunk(sp.size, dim=ctx.dim)[sp.rank] * sp.size, None, None


def gather_sequence(x: torch.Tensor, sp: SequenceParallel, dim: int = 0) -> torch.Tensor:
    """The group's slices of a per-token tensor joined along ``dim`` (differentiable)."""
    return _Gather.apply(x, sp, dim)


class UlyssesForward:
    """What the attention wrappers need for one forward: the group, and the positions of
    the whole (padded) packed row ``[1, T]``, from which sequences are told apart as
    transformers does it (a position that does not follow its predecessor's by 1)."""

    def __init__(self, sp: SequenceParallel, position_ids: torch.Tensor):
        self.sp, self.position_ids = sp, position_ids
        self._mask: Optional[torch.Tensor] = None

    def causal_mask(self) -> torch.Tensor:
        """Boolean ``[1, 1, T, T]``: causal within each packed sequence, nothing across."""
        if self._mask is None:  # one mask serves every layer (and their recomputation)
            pos = self.position_ids[0]
            starts = torch.ones_like(pos, dtype=torch.bool)
            starts[1:] = pos[1:] != pos[:-1] + 1
            seq = starts.cumsum(0)
            index = torch.arange(pos.numel(), device=pos.device)
            mask = (seq[:, None] == seq[None, :]) & (index[None, :] <= index[:, None])
            self._mask = mask[None, None]
        return self._mask


def _wrap(original, flash: bool):
    def attention(module, query, key, value, attention_mask, **kwargs):
        forward: Optional[UlyssesForward] = kwargs.pop(KWARG, None)
        if forward is None:
            return original(module, query, key, value, attention_mask, **kwargs)
        group = forward.sp.group
        # [B, heads, T/s, D] -> [B, heads/s, T, D]
        query, key, value = (all_to_all(t, group, 1, 2) for t in (query, key, value))
        # the mask transformers built covers this rank's slice only: use the whole row's
        kwargs["position_ids"] = forward.position_ids
        mask = None if flash else forward.causal_mask()  # flash: varlen by positions
        out, _ = original(module, query, key, value, mask, **kwargs)
        # [B, T, heads/s, D] -> [B, T/s, heads, D]
        return all_to_all(out, group, 1, 2), None

    attention.siirl_ulysses = True
    return attention


def install() -> None:
    """Wrap transformers' sdpa and flash attention functions (once per process)."""
    from transformers.modeling_utils import AttentionInterface

    mapping = AttentionInterface._global_mapping
    for name in _SDPA + _FLASH:
        original = mapping.get(name)
        if original is not None and not getattr(original, "siirl_ulysses", False):
            AttentionInterface.register(name, _wrap(original, flash=name in _FLASH))


def _transformers_config(module: torch.nn.Module) -> Any:
    from transformers import PreTrainedModel

    model = next((m for m in module.modules() if isinstance(m, PreTrainedModel)), None)
    if model is None:
        return None
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def check_model(module: torch.nn.Module, size: int, key: str) -> None:
    """Refuse a model the split cannot serve: heads that do not divide by ``size``
    (``key``), an attention implementation that is not wrapped, a sliding window."""
    config = _transformers_config(module)
    if config is None:
        return  # not a transformers model: it runs unsplit (see ulysses_forward)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    if heads % size or kv_heads % size:
        raise ConfigError(
            f"{key}={size} must divide the model's attention heads ({heads}) and key/value "
            f"heads ({kv_heads}): Ulysses gives each rank of a sequence-parallel group an "
            f"equal share of both. Use a size that divides both, or 1.")
    impl = getattr(config, "_attn_implementation", None)
    if impl not in _SDPA + _FLASH:
        raise ConfigError(
            f"{key}={size} runs attention through transformers' sdpa or flash_attention_* "
            f"functions (transformers' default for Llama and Qwen2); this model uses "
            f"{impl!r}. Use such a model, or keep the size at 1.")
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window",
                                                                None):
        raise ConfigError(
            f"{key}={size}: this model attends through a sliding window, which the "
            f"sequence-parallel attention does not apply; keep the size at 1.")
