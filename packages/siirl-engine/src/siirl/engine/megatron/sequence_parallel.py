"""Sequence parallelism with megatron's local (non-Transformer-Engine) layer spec.

With ``sequence_parallel`` the activations outside attention and MLP (norms, residuals,
dropout) are split along the sequence over the tensor-parallel ranks. Megatron's local spec
refuses it only because its torch norm fallback does not mark its weight; the math is the
same. So the local spec here uses :class:`MegatronRMSNorm` (torch's RMSNorm, weight marked
``sequence_parallel``), each rank's norm-weight gradient then covers its slice of the
sequence and :func:`sum_sequence_parallel_grads` sums them over the TP group (megatron's
``finalize_model_grads`` does the same for TE norms). Sequences must split evenly: batches
are left-padded to a multiple of the TP size (:func:`sequence_multiple`), which leaves the
response positions, and so log-probs and values, unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class MegatronRMSNorm(torch.nn.RMSNorm):
    """torch RMSNorm built the way megatron builds norms (config, hidden_size, eps)."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_unused: Any):
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.weight.sequence_parallel = bool(config.sequence_parallel)


class MegatronQKNorm(torch.nn.RMSNorm):
    """torch RMSNorm over each attention head's queries or keys (megatron's ``qk_layernorm``;
    megatron's torch-norm fallback refuses sequence parallelism although attention sees whole
    sequences). Its weight is replicated over TP while each rank normalises its own heads, so
    its gradient is partial per rank: summed over TP like a sequence-parallel norm's (megatron's
    ``finalize_model_grads`` does the same by name)."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_unused: Any):
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.weight.partial_over_tensor_parallel = True


def local_block_spec(layer_spec: Any, config: Any, vp_stage: int | None = None) -> Any:
    """The decoder-block spec of this stage from megatron's local layer spec (or a list of
    them, one per layer of the stage), with :class:`MegatronRMSNorm` for the layer norms and
    the final norm and :class:`MegatronQKNorm` for QK-norms."""
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    specs = layer_spec if isinstance(layer_spec, list) else \
        [layer_spec] * get_num_layers_to_build(config, vp_stage=vp_stage)
    for spec in {id(spec): spec for spec in specs}.values():
        spec.submodules.input_layernorm = MegatronRMSNorm
        spec.submodules.pre_mlp_layernorm = MegatronRMSNorm
        attention = spec.submodules.self_attention.submodules
        for name in ("q_layernorm", "k_layernorm"):
            if getattr(attention, name, IdentityOp) is not IdentityOp:
                setattr(attention, name, MegatronQKNorm)
    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=MegatronRMSNorm)


def sequence_multiple(config: Any) -> int:
    """Sequence lengths must be a multiple of this (the TP size with sequence parallelism)."""
    return config.tensor_model_parallel_size if config.sequence_parallel else 1


def sum_sequence_parallel_grads(module: torch.nn.Module, tp_group: Any) -> None:
    """Sum the gradients of weights marked ``sequence_parallel`` (and of QK-norm weights)
    over the TP group."""
    if tp_group is None:
        return
    for param in module.parameters():
        partial = getattr(param, "sequence_parallel", False) or getattr(
            param, "partial_over_tensor_parallel", False)
        if partial and param.grad is not None:
            dist.all_reduce(param.grad, group=tp_group)


def gather_sequence(hidden: torch.Tensor, config: Any) -> torch.Tensor:
    """Full-sequence hidden states ``[S, B, H]`` from this rank's sequence slice, for a
    head that every TP rank computes alike (the critic's value head): the backward takes
    this rank's slice of the gradient, nothing is summed."""
    if not config.sequence_parallel:
        return hidden
    from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

    return gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
