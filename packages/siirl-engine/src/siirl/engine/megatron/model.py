"""Build megatron-core GPTModels from Hugging Face Llama / Qwen2 / Qwen3 (QK-norm) configs and
Qwen3-MoE / Mixtral ones (:mod:`siirl.engine.megatron.moe`), and run them the way
this repo feeds HF models (left-padded ``[B, S]`` batches with explicit ``position_ids``).

Two deliberate departures from a stock GPTModel, both so that its log-probs match HF's:

* RoPE angles come from the ``position_ids`` given to ``forward`` (megatron's GPTModel
  ignores them and rotates token ``i`` by angle ``i``; with left padding that shifts every
  position by the pad count -- equal in exact arithmetic, not in float).
* RoPE inverse frequencies are taken from HF's own rotary module for the config (covers
  ``rope_theta`` and static scalings such as "linear" and "llama3" exactly).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.common.embeddings.rope_utils import get_pos_emb_on_this_cp_rank
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer import TransformerConfig

from siirl.engine.megatron.moe import (
    check_moe,
    expert_layers,
    is_moe,
    mark_expert_parameters,
    moe_config_kwargs,
    route_without_transformer_engine,
)

__all__ = ["SUPPORTED_MODEL_TYPES", "HFPositionGPTModel", "build_gpt_model", "forward_logits",
           "hf_inv_freq", "layer_spec", "megatron_attention_mask", "padded_vocab_size",
           "transformer_config_from_hf", "unwrap_model"]

# model_type -> (module, rotary class) of the HF implementation whose weights we map
SUPPORTED_MODEL_TYPES = {
    "llama": ("transformers.models.llama.modeling_llama", "LlamaRotaryEmbedding"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2RotaryEmbedding"),
    "qwen3": ("transformers.models.qwen3.modeling_qwen3", "Qwen3RotaryEmbedding"),
    "qwen2_moe": ("transformers.models.qwen2_moe.modeling_qwen2_moe", "Qwen2MoeRotaryEmbedding"),
    "qwen3_moe": ("transformers.models.qwen3_moe.modeling_qwen3_moe", "Qwen3MoeRotaryEmbedding"),
    "mixtral": ("transformers.models.mixtral.modeling_mixtral", "MixtralRotaryEmbedding"),
}
# RMSNorm over each head's queries and keys before RoPE (megatron's qk_layernorm)
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")


def _check_supported(hf_config) -> None:
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError(f"no megatron mapping for model_type={model_type!r}; "
                                  f"supported: {sorted(SUPPORTED_MODEL_TYPES)}")
    if model_type != "qwen2" and getattr(hf_config, "attention_bias", False):
        # HF then puts a bias on o_proj too; megatron has no "bias on linear_proj only".
        raise NotImplementedError(f"{model_type} with attention_bias=True is not supported")
    if getattr(hf_config, "mlp_bias", False):
        raise NotImplementedError("mlp_bias=True is not supported")
    if getattr(hf_config, "use_sliding_window", False):
        raise NotImplementedError("sliding-window attention is not supported")
    check_moe(hf_config)


def head_dim(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // hf_config.num_attention_heads)


def has_qk_norm(hf_config) -> bool:
    return hf_config.model_type in QK_NORM_MODEL_TYPES


def has_qkv_bias(hf_config) -> bool:
    if hf_config.model_type == "qwen2_moe":  # its own key (o_proj never has a bias)
        return bool(getattr(hf_config, "qkv_bias", True))
    return hf_config.model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False))


def padded_vocab_size(vocab_size: int, tp_size: int, divisible_by: int = 1) -> int:
    """Megatron splits the vocabulary evenly over TP ranks, so the embedding and output layer
    have ``vocab_size`` rounded up to a multiple of ``divisible_by * tp_size``. The extra rows
    are zero-filled by the bridge and sliced off logits by :func:`forward_logits`."""
    multiple = divisible_by * tp_size
    return -(-vocab_size // multiple) * multiple


def hf_inv_freq(hf_config) -> torch.Tensor:
    """RoPE inverse frequencies exactly as HF computes them for this config (float32)."""
    module_name, class_name = SUPPORTED_MODEL_TYPES[hf_config.model_type]
    rotary = getattr(importlib.import_module(module_name), class_name)(config=hf_config)
    if float(getattr(rotary, "attention_scaling", 1.0)) != 1.0 or getattr(
            rotary, "rope_type", "default") in ("dynamic", "longrope"):
        raise NotImplementedError(f"RoPE type {getattr(rotary, 'rope_type', '?')!r} "
                                  "(position-dependent or with attention scaling)")
    return rotary.inv_freq.detach().float().cpu().clone()


def stage_layer_counts(num_layers: int, pp_size: int) -> list[int]:
    """Decoder layers per pipeline stage: an even split, or, when ``pp_size`` does not divide
    ``num_layers``, equal middle stages with the remainder on the first and last stage (the
    only uneven split megatron builds: ``num_layers_in_first/last_pipeline_stage``)."""
    per_stage, extra = divmod(num_layers, pp_size)
    if per_stage == 0 or (extra and pp_size == 1):
        raise ValueError(f"{num_layers} layers cannot fill {pp_size} pipeline stages")
    counts = [per_stage] * pp_size
    counts[0] += extra - extra // 2
    counts[-1] += extra // 2
    return counts


def transformer_config_from_hf(hf_config, tp: int = 1, pp: int = 1, cp: int = 1,
                               sequence_parallel: bool = False,
                               params_dtype: torch.dtype = torch.float32,
                               use_cpu_initialization: bool | None = None,
                               **overrides: Any) -> TransformerConfig:
    """A megatron TransformerConfig equivalent to an HF Llama / Qwen2 config.

    Fusions that need CUDA kernels (apex, TE, jit) are off; pass ``overrides`` to turn them
    on for GPU runs. ``use_cpu_initialization`` defaults to "no CUDA available".
    """
    _check_supported(hf_config)
    if is_moe(hf_config) and tp > 1 and not sequence_parallel:
        raise ValueError(f"a {hf_config.model_type} model at tensor_model_parallel_size={tp} "
                         "needs sequence_parallel=true (megatron's MoE layer refuses to train "
                         "with TP and without sequence parallelism)")
    if use_cpu_initialization is None:
        use_cpu_initialization = not torch.cuda.is_available()
    kwargs = dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads or hf_config.num_attention_heads,
        kv_channels=head_dim(hf_config),
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,  # SwiGLU: linear_fc1 holds [gate; up]
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=has_qkv_bias(hf_config),
        qk_layernorm=has_qk_norm(hf_config),
        hidden_dropout=0.0,
        attention_dropout=float(getattr(hf_config, "attention_dropout", 0.0) or 0.0),
        attention_softmax_in_fp32=True,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        sequence_parallel=sequence_parallel,
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        pipeline_dtype=params_dtype,
        use_cpu_initialization=use_cpu_initialization,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        cuda_graph_scope=[],  # what megatron's default "full" becomes, minus its warning
        **moe_config_kwargs(hf_config),
    )
    if pp > 1 and hf_config.num_hidden_layers % pp:
        counts = stage_layer_counts(hf_config.num_hidden_layers, pp)
        kwargs.update(num_layers_in_first_pipeline_stage=counts[0],
                      num_layers_in_last_pipeline_stage=counts[-1])
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def have_transformer_engine() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def layer_spec(use_te: bool | None = None, config: TransformerConfig | None = None,
               experts: bool = True):
    """Transformer Engine layer spec when TE is importable, else megatron's local spec, with
    ``config``'s QK-norm and (``experts``) its experts (megatron's SequentialMLP: no grouped
    GEMM). With TE the dense layers' RMSNorms are fused into ``linear_qkv`` /
    ``linear_fc1`` (the bridge follows)."""
    from megatron.core.models.gpt import gpt_layer_specs

    if use_te is None:
        use_te = have_transformer_engine()
    kwargs = {} if config is None else dict(
        num_experts=config.num_moe_experts if experts else None,
        qk_layernorm=config.qk_layernorm)
    if use_te:
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(**kwargs)
    return gpt_layer_specs.get_gpt_layer_local_spec(normalization="RMSNorm", **kwargs)


def _stage_spec(hf_config, config: TransformerConfig, use_te: bool, vp_stage: int | None):
    """The layer spec of every layer (one spec), or with dense layers mixed into an MoE
    model (``moe_layer_freq`` a pattern) the decoder-block spec of this stage's layers."""
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from siirl.engine.megatron.sequence_parallel import local_block_spec

    pattern = expert_layers(hf_config)
    if not is_moe(hf_config) or all(pattern):
        spec = layer_spec(use_te, config)
        # megatron's torch-norm fallback cannot do sequence parallelism
        return spec if use_te else local_block_spec(spec, config, vp_stage)
    expert, dense = layer_spec(use_te, config), layer_spec(use_te, config, experts=False)
    offset = get_transformer_layer_offset(config, vp_stage)
    specs = [expert if pattern[offset + i] else dense
             for i in range(get_num_layers_to_build(config, vp_stage=vp_stage))]
    if not use_te:
        return local_block_spec(specs, config, vp_stage)
    from megatron.core.extensions.transformer_engine import TENorm

    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=TENorm)


def rope_from_position_ids(inv_freq: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Megatron's rotary tensor ``[S, B, 1, D]`` for explicit ``position_ids [B, S]``; computed
    like HF (``position * inv_freq`` in float32). Megatron's unfused RoPE broadcasts over B."""
    freqs = position_ids.to(inv_freq.device)[..., None].float() * inv_freq.float()  # [B, S, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.transpose(0, 1).unsqueeze(2).contiguous()


class HFPositionGPTModel(GPTModel):
    """GPTModel whose RoPE follows the ``position_ids`` given to forward (see module doc).

    Falls back to megatron's own angles for packed sequences, inference contexts or when no
    ``position_ids`` are given. Pipeline stages must all receive the same ``position_ids``.
    """

    def _preprocess(self, input_ids, position_ids, decoder_input=None, inference_context=None,
                    packed_seq_params=None, padding_mask=None):
        out = super()._preprocess(input_ids, position_ids, decoder_input=decoder_input,
                                  inference_context=inference_context,
                                  packed_seq_params=packed_seq_params, padding_mask=padding_mask)
        if (position_ids is None or packed_seq_params is not None or inference_context
                is not None or out[1] is None or self.position_embedding_type != "rope"):
            return out
        emb = rope_from_position_ids(self.rotary_pos_emb.inv_freq, position_ids)
        cp_group = getattr(self.rotary_pos_emb, "cp_group", None)
        if cp_group is not None and cp_group.size() > 1:
            emb = get_pos_emb_on_this_cp_rank(emb, 0, cp_group)
        return (out[0], emb.to(out[1].device), *out[2:])


def build_gpt_model(hf_config, pre_process: bool = True, post_process: bool = True,
                    config: TransformerConfig | None = None, use_te: bool | None = None,
                    vocab_divisible_by: int = 1, vp_stage: int | None = None,
                    **config_kwargs: Any) -> HFPositionGPTModel:
    """One pipeline stage of the megatron model for ``hf_config``.

    Model-parallel state must be initialised (``parallel_state.initialize_model_parallel``);
    TP/PP sizes default to the initialised ones. Weights are randomly initialised: load
    HF weights with :func:`siirl.engine.megatron.bridge.load_hf_weights`.
    """
    if config is None:
        config_kwargs.setdefault("tp", parallel_state.get_tensor_model_parallel_world_size())
        config_kwargs.setdefault("pp", parallel_state.get_pipeline_model_parallel_world_size())
        if is_moe(hf_config):
            config_kwargs.setdefault("expert_model_parallel_size",
                                     parallel_state.get_expert_model_parallel_world_size())
            config_kwargs.setdefault("expert_tensor_parallel_size",
                                     parallel_state.get_expert_tensor_parallel_world_size())
        vpp = parallel_state.get_virtual_pipeline_model_parallel_world_size()
        if vpp is not None and vpp > 1:
            config_kwargs.setdefault("virtual_pipeline_model_parallel_size", vpp)
        config = transformer_config_from_hf(hf_config, **config_kwargs)
    _check_supported(hf_config)
    if use_te is None:
        use_te = have_transformer_engine()
    if is_moe(hf_config) and not use_te:
        route_without_transformer_engine()
    spec = _stage_spec(hf_config, config, use_te, vp_stage)
    model = HFPositionGPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=padded_vocab_size(hf_config.vocab_size, config.tensor_model_parallel_size,
                                     vocab_divisible_by),
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings",
                                                         False)),
        position_embedding_type="rope",
        rotary_base=int(_rope_theta(hf_config)),
        vp_stage=vp_stage,
    )
    mark_expert_parameters(model, config)
    inv_freq = hf_inv_freq(hf_config).to(model.rotary_pos_emb.inv_freq.device)
    model.rotary_pos_emb.inv_freq = inv_freq
    # read back by the bridge (vocab padding) and forward_logits (dropping padded logits)
    model.hf_vocab_size = hf_config.vocab_size
    model.vocab_divisible_by = vocab_divisible_by
    return model


def _rope_theta(hf_config) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def megatron_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` HF mask (1 = token) -> megatron's ``[B, 1, S, S]`` bool mask, True = masked
    out: causal, and no attending to padding. Fully masked rows (left-pad queries) are
    harmless: megatron fills masked scores with -10000, not -inf, so no NaNs."""
    seq = attention_mask.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=attention_mask.device).triu(1)
    pad_key = ~attention_mask.bool()[:, None, None, :]
    return causal[None, None] | pad_key


def forward_logits(model: GPTModel, input_ids: torch.Tensor, position_ids: torch.Tensor,
                   attention_mask: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
    """HF-comparable logits ``[B, S, V]`` (full vocabulary, TP-gathered) on a left-padded batch.

    For a PP=1 model, or the last pipeline stage after ``model.set_input_tensor(hidden)``.
    ``vocab_size`` (the HF one) drops vocab padding; it defaults to the ``hf_vocab_size``
    attribute that :func:`build_gpt_model` sets. Gathering the vocabulary costs
    ``B*S*V`` floats per rank: fine for tests and small vocabularies; a training loss
    should use vocab-parallel log-probs instead."""
    if not unwrap_model(model).post_process:
        raise ValueError("forward_logits needs the last pipeline stage (post_process=True)")
    mask = megatron_attention_mask(attention_mask)
    logits = model(input_ids, position_ids, mask, runtime_gather_output=True)  # [B, S, Vpad]
    vocab_size = vocab_size or getattr(unwrap_model(model), "hf_vocab_size", None)
    if vocab_size is not None:
        logits = logits[..., :vocab_size]
    return logits


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside megatron's DDP / Float16Module wrappers (they keep it in .module)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model
