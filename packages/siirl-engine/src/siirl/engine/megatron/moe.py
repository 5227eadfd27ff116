"""What megatron-core needs to build Qwen2-MoE, Qwen3-MoE and Mixtral models like Hugging
Face's.

All three route each token to its top-k experts by a softmax router and sum the chosen
SwiGLU experts' outputs weighted by the routing probabilities; Qwen2-MoE adds an always-on
shared expert whose output is scaled by a sigmoid gate (megatron's shared expert with
``moe_shared_expert_gate``). They differ in whether the top-k probabilities are renormalised:

* Mixtral (and Qwen2/3-MoE with ``norm_topk_prob=True``) renormalise: softmax over the top-k
  logits, which is megatron's ``moe_router_pre_softmax=False``;
* Qwen2/3-MoE with ``norm_topk_prob=False`` keeps the full-softmax probabilities of the chosen
  experts: megatron's ``moe_router_pre_softmax=True``.

Experts are megatron's local ``SequentialMLP`` (one ColumnParallel fc1 / RowParallel fc2 per
expert, no grouped GEMM, which needs Transformer Engine or CUDA kernels), no token dropping
(no capacity factor), router in float32. Hugging Face's load-balancing loss only enters
training with ``output_router_logits=True``; megatron's ``aux_loss`` with the same
coefficient then stands in for it (megatron's is the Switch-Transformer loss over the
micro-batch's tokens, as HF's, except that HF leaves padding out).

The bridge reads transformers >= 5's fused expert tensors (``mlp.experts.gate_up_proj``
``[E, 2I, H]`` = ``[gate; up]`` per expert, ``mlp.experts.down_proj`` ``[E, H, I]``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MOE_MODEL_TYPES", "check_moe", "expert_layers", "is_moe", "moe_config_kwargs",
           "mark_expert_parameters", "num_experts", "route_without_transformer_engine",
           "shared_expert_size"]

MOE_MODEL_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral")


def is_moe(hf_config: Any) -> bool:
    return getattr(hf_config, "model_type", None) in MOE_MODEL_TYPES


def num_experts(hf_config: Any) -> int:
    return int(getattr(hf_config, "num_experts", None) or hf_config.num_local_experts)


def _expert_ffn_size(hf_config: Any) -> int:
    if hf_config.model_type in ("qwen2_moe", "qwen3_moe"):
        return int(hf_config.moe_intermediate_size)
    return int(hf_config.intermediate_size)


def expert_layers(hf_config: Any) -> list[bool]:
    """Which layers are expert layers, as Hugging Face builds them: Qwen2/3-MoE's layer i
    unless it is in ``mlp_only_layers`` or ``(i + 1) % decoder_sparse_step`` is not 0 (those
    get a dense SwiGLU of ``intermediate_size``); every layer of Mixtral."""
    layers = int(hf_config.num_hidden_layers)
    if not is_moe(hf_config):
        return [False] * layers
    dense = set(getattr(hf_config, "mlp_only_layers", None) or ())
    step = int(getattr(hf_config, "decoder_sparse_step", 1) or 1)
    return [i not in dense and (i + 1) % step == 0 for i in range(layers)]


def shared_expert_size(hf_config: Any) -> int | None:
    """The intermediate size of the always-on shared expert (Qwen2-MoE's, behind a sigmoid
    gate: megatron's ``moe_shared_expert_gate``); None where the model has none."""
    if hf_config.model_type != "qwen2_moe":
        return None
    return int(hf_config.shared_expert_intermediate_size or 0) or None


def _renormalises_top_k(hf_config: Any) -> bool:
    return hf_config.model_type == "mixtral" or bool(getattr(hf_config, "norm_topk_prob",
                                                             False))


def check_moe(hf_config: Any) -> None:
    """Refuse the MoE variants the bridge cannot reproduce, each with the reason."""
    if not is_moe(hf_config):
        return
    import transformers

    name = f"{hf_config.model_type} model"
    if int(transformers.__version__.split(".")[0]) < 5:
        raise NotImplementedError(
            f"the megatron bridge of a {name} maps transformers >= 5's fused expert tensors "
            f"(mlp.experts.gate_up_proj / down_proj); transformers {transformers.__version__} "
            "keeps one module per expert: upgrade transformers")
    if not any(expert_layers(hf_config)):
        raise NotImplementedError(
            f"a {name} without one expert layer (mlp_only_layers="
            f"{getattr(hf_config, 'mlp_only_layers', None)}, decoder_sparse_step="
            f"{getattr(hf_config, 'decoder_sparse_step', 1)}): load it as its dense "
            "architecture")
    if float(getattr(hf_config, "router_jitter_noise", 0.0) or 0.0):
        raise NotImplementedError(
            f"router_jitter_noise={hf_config.router_jitter_noise}: HF scales the expert "
            "input by the noise too, megatron's moe_input_jitter_eps only the router's; set "
            "it to 0")
    if int(hf_config.num_experts_per_tok) == 1 and _renormalises_top_k(hf_config):
        raise NotImplementedError(
            f"top-1 routing with renormalised probabilities (every weight 1) in a {name}: "
            "megatron refuses it (zero router gradient)")


def moe_config_kwargs(hf_config: Any) -> dict[str, Any]:
    """TransformerConfig keys of the MoE layers (empty for a dense model)."""
    if not is_moe(hf_config):
        return {}
    check_moe(hf_config)
    aux_coeff = float(getattr(hf_config, "router_aux_loss_coef", 0.0) or 0.0) \
        if getattr(hf_config, "output_router_logits", False) else 0.0
    return dict(
        num_moe_experts=num_experts(hf_config),
        moe_router_topk=int(hf_config.num_experts_per_tok),
        moe_ffn_hidden_size=_expert_ffn_size(hf_config),
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not _renormalises_top_k(hf_config),
        moe_router_dtype="fp32",
        moe_router_load_balancing_type="aux_loss" if aux_coeff else "none",
        moe_aux_loss_coeff=aux_coeff,
        moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=False,
        moe_permute_fusion=False,
        moe_shared_expert_intermediate_size=shared_expert_size(hf_config),
        moe_shared_expert_gate=shared_expert_size(hf_config) is not None,
        # megatron's per-layer pattern where dense layers are mixed in (1: every layer)
        moe_layer_freq=1 if all(expert_layers(hf_config)) else
        [int(x) for x in expert_layers(hf_config)],
    )


def mark_expert_parameters(model: Any, config: Any) -> None:
    """megatron-core 0.16 marks expert weights ``allreduce=False`` (its DDP then sums their
    gradients over the expert data-parallel group, its optimizer counts their norm over the
    expert groups) only at EP > 1. With an expert TP other than TP their data-parallel group
    differs from the dense layers' at EP 1 too (TP 2 x expert TP 1: both TP ranks hold every
    whole expert and feed it their own sequence-parallel tokens): mark them there as well."""
    if not config.num_moe_experts or config.expert_model_parallel_size > 1 or \
            config.expert_tensor_parallel_size == config.tensor_model_parallel_size:
        return
    for name, param in model.named_parameters():
        if ".mlp.experts." in f".{name}":  # not the shared expert (a dense MLP)
            param.allreduce = False


def route_without_transformer_engine() -> None:
    """megatron-core 0.16's router gating tests ``te_general_gemm is not None``, a name its
    ``moe_utils`` defines only when Transformer Engine imports: without TE every MoE forward
    raises NameError, on the GPU as on the CPU. None selects megatron's own ``torch.mm``."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
