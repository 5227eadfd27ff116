"""Hugging Face <-> megatron-core weights for Llama / Qwen2 / Qwen3 and the Qwen2-MoE /
Qwen3-MoE / Mixtral experts, for any TP / PP layout.

Every megatron parameter of a stage is one :class:`Entry`: its megatron key, the HF tensors
it is built from, and how it is sharded over TP ranks. Conversions are pure slicing and
concatenation, so HF -> megatron -> HF is bit-exact. Layouts (megatron-core 0.16):

* ``linear_qkv`` (column parallel): rows are grouped per query group ``g`` as
  ``[q heads of g; k_g; v_g]``; TP ranks get whole groups (``num_query_groups % tp == 0``).
* ``linear_fc1`` (column parallel, SwiGLU): rank r holds ``[gate_shard_r; up_shard_r]``.
* ``linear_proj`` / ``linear_fc2`` (row parallel): split along the input dim (dim 1).
* embedding / ``output_layer`` (vocab parallel): split along the vocabulary, after padding it
  with zero rows to :func:`~siirl.engine.megatron.model.padded_vocab_size`.
* RMSNorm weights are replicated. With the local spec they are ``input_layernorm`` /
  ``pre_mlp_layernorm``; with the Transformer Engine spec they are fused into
  ``linear_qkv.layer_norm_weight`` / ``linear_fc1.layer_norm_weight``.
* Qwen3's QK-norms (``q_norm`` / ``k_norm``, one weight of head_dim shared by all heads) are
  megatron's replicated ``q_layernorm`` / ``k_layernorm``.
* MoE layers: the router ``mlp.gate.weight`` is megatron's replicated ``mlp.router.weight``;
  expert ``e`` of HF's fused ``mlp.experts.gate_up_proj[e]`` (``[gate; up]``) and
  ``down_proj[e]`` are ``mlp.experts.local_experts.e.linear_fc1`` / ``linear_fc2``, split like
  a dense layer's fc1 / fc2 but over the expert-tensor-parallel ranks (megatron's
  ``expert_tensor_parallel_size``, by default TP; 1: whole experts on every rank while the
  dense layers are split over TP). HF's stacked tensor is rebuilt from all
  experts' entries (entries of one HF tensor are consecutive). Qwen2-MoE's shared expert
  (``mlp.shared_expert``) is megatron's ``mlp.shared_experts`` MLP, split like a dense one,
  and its sigmoid gate ``mlp.shared_expert_gate`` the replicated ``shared_experts.gate_weight``.
  Dense layers of an MoE model (Qwen2/3-MoE's ``mlp_only_layers``, ``decoder_sparse_step``)
  map like a dense model's.
* Layers are split evenly over PP stages (stage p holds global layers ``p*L/pp ...``); the
  embedding lives on the first stage, ``final_layernorm`` / ``output_layer`` on the last.
  With tied embeddings and PP > 1 the last stage holds a copy of the embedding as
  ``output_layer.weight``; with PP = 1 there is no ``output_layer.weight``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from siirl.engine.common.weight_sync import buckets_of

from .model import (
    has_qk_norm,
    has_qkv_bias,
    head_dim,
    padded_vocab_size,
    stage_layer_counts,
    unwrap_model,
)
from .moe import expert_layers, is_moe, num_experts, shared_expert_size

__all__ = ["Entry", "hf_to_megatron", "iter_hf_weights", "layer_range", "load_hf_weights",
           "megatron_to_hf", "stage_entries", "stage_layer_counts"]


@dataclass(frozen=True)
class Entry:
    mcore: str              # megatron key, layer index local to the stage
    hf: tuple[str, ...]     # HF tensors it is built from (several for fused ones)
    kind: str               # replicated | column | row | vocab | qkv | fc1 | (expert_)fc1/row
    export: bool = True     # False: a duplicate (tied output layer) not exported to HF
    expert: int | None = None  # index into HF's stacked expert tensor (hf[0]); None: whole


def local_experts(hf_config, ep_rank: int = 0, ep_size: int = 1) -> range:
    """The global experts of expert-parallel rank ``ep_rank`` (megatron: contiguous blocks)."""
    total = num_experts(hf_config)
    if total % ep_size:
        raise ValueError(f"{total} experts do not split over expert_model_parallel_size="
                         f"{ep_size}")
    return range(ep_rank * total // ep_size, (ep_rank + 1) * total // ep_size)


def _mlp_entries(hf_config, m: str, h: str, ep_rank: int, ep_size: int,
                 experts_here: bool) -> list[Entry]:
    """The MLP of one layer (after its norm): SwiGLU, or (``experts_here``) router and
    SequentialMLP experts (this EP rank's: local expert ``i`` is global expert
    ``experts[i]``)."""
    if not experts_here:
        return [Entry(m + "mlp.linear_fc1.weight",
                      (h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"), "fc1"),
                Entry(m + "mlp.linear_fc2.weight", (h + "mlp.down_proj.weight",), "row")]
    experts, local = local_experts(hf_config, ep_rank, ep_size), m + "mlp.experts.local_experts."
    shared = []
    if shared_expert_size(hf_config):  # split over TP like a dense MLP; its gate replicated
        mine, theirs = m + "mlp.shared_experts.", h + "mlp.shared_expert"
        shared = [Entry(mine + "linear_fc1.weight",
                        (theirs + ".gate_proj.weight", theirs + ".up_proj.weight"), "fc1"),
                  Entry(mine + "linear_fc2.weight", (theirs + ".down_proj.weight",), "row"),
                  Entry(mine + "gate_weight", (theirs + "_gate.weight",), "replicated")]
    return ([Entry(m + "mlp.router.weight", (h + "mlp.gate.weight",), "replicated")]
            + [Entry(f"{local}{i}.linear_fc1.weight", (h + "mlp.experts.gate_up_proj",), "fc1",
                     expert=e) for i, e in enumerate(experts)]
            + [Entry(f"{local}{i}.linear_fc2.weight", (h + "mlp.experts.down_proj",), "row",
                     expert=e) for i, e in enumerate(experts)]
            + shared)


def layer_range(num_layers: int, pp_rank: int, pp_size: int) -> range:
    counts = stage_layer_counts(num_layers, pp_size)
    start = sum(counts[:pp_rank])
    return range(start, start + counts[pp_rank])


def stage_entries(hf_config, pp_rank: int = 0, pp_size: int = 1, te_layout: bool = False,
                  ep_rank: int = 0, ep_size: int = 1) -> list[Entry]:
    """The parameters of PP stage ``pp_rank`` (and EP rank ``ep_rank``'s experts)."""
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    qkv_names = ("q_proj", "k_proj", "v_proj")
    entries = []
    if first:
        entries.append(Entry("embedding.word_embeddings.weight",
                             ("model.embed_tokens.weight",), "vocab"))
    expert_layer = expert_layers(hf_config)
    for local, layer in enumerate(layer_range(hf_config.num_hidden_layers, pp_rank, pp_size)):
        m, h = f"decoder.layers.{local}.", f"model.layers.{layer}."
        ln_in = "self_attention.linear_qkv.layer_norm_weight" if te_layout else \
            "input_layernorm.weight"
        ln_mlp = "mlp.linear_fc1.layer_norm_weight" if te_layout and not expert_layer[layer] \
            else "pre_mlp_layernorm.weight"  # TE fuses no norm into a MoE layer
        entries += [
            Entry(m + ln_in, (h + "input_layernorm.weight",), "replicated"),
            Entry(m + "self_attention.linear_qkv.weight",
                  tuple(f"{h}self_attn.{n}.weight" for n in qkv_names), "qkv"),
        ]
        if has_qkv_bias(hf_config):
            entries.append(Entry(m + "self_attention.linear_qkv.bias",
                                 tuple(f"{h}self_attn.{n}.bias" for n in qkv_names), "qkv"))
        if has_qk_norm(hf_config):
            entries += [Entry(f"{m}self_attention.{n}_layernorm.weight",
                              (f"{h}self_attn.{n}_norm.weight",), "replicated") for n in "qk"]
        entries += [
            Entry(m + "self_attention.linear_proj.weight", (h + "self_attn.o_proj.weight",),
                  "row"),
            Entry(m + ln_mlp, (h + "post_attention_layernorm.weight",), "replicated"),
            *_mlp_entries(hf_config, m, h, ep_rank, ep_size, expert_layer[layer]),
        ]
    if last:
        entries.append(Entry("decoder.final_layernorm.weight", ("model.norm.weight",),
                             "replicated"))
        if not tied:
            entries.append(Entry("output_layer.weight", ("lm_head.weight",), "vocab"))
        elif not first:
            entries.append(Entry("output_layer.weight", ("model.embed_tokens.weight",), "vocab",
                                 export=False))
    return entries


def _qkv_groups(hf_config) -> tuple[int, int, int]:
    groups = hf_config.num_key_value_heads or hf_config.num_attention_heads
    return groups, hf_config.num_attention_heads // groups, head_dim(hf_config)


def _shard(entry: Entry, tensors: list[torch.Tensor], hf_config, tp_rank: int, tp_size: int,
           vocab_divisible_by: int) -> torch.Tensor:
    kind = entry.kind
    if entry.expert is not None:  # this expert's slice of HF's stacked tensor
        tensors = [tensors[0][entry.expert]]
        if kind == "fc1":
            tensors = list(tensors[0].chunk(2, dim=0))  # [gate; up]
    if kind == "replicated":
        return tensors[0].clone()
    if kind == "column":
        return tensors[0].chunk(tp_size, dim=0)[tp_rank].clone()
    if kind == "row":
        return tensors[0].chunk(tp_size, dim=1)[tp_rank].clone()
    if kind == "vocab":
        full = tensors[0]
        padded = padded_vocab_size(full.shape[0], tp_size, vocab_divisible_by)
        if padded != full.shape[0]:
            full = torch.cat([full, full.new_zeros(padded - full.shape[0], *full.shape[1:])])
        return full.chunk(tp_size, dim=0)[tp_rank].clone()
    if kind == "fc1":
        return torch.cat([t.chunk(tp_size, dim=0)[tp_rank] for t in tensors])
    if kind == "qkv":
        groups, per_group, dim = _qkv_groups(hf_config)
        if groups % tp_size:
            raise ValueError(f"{groups} query groups do not split over TP={tp_size}")
        q, k, v = tensors
        rest = q.shape[1:]  # (hidden,) for weights, () for biases
        fused = torch.cat([q.reshape(groups, per_group * dim, *rest),
                           k.reshape(groups, dim, *rest), v.reshape(groups, dim, *rest)], dim=1)
        n = groups // tp_size
        return fused[tp_rank * n:(tp_rank + 1) * n].reshape(-1, *rest).clone()
    raise ValueError(f"unknown shard kind {kind!r}")


def _merge(entry: Entry, shards: Sequence[torch.Tensor], hf_config) -> list[torch.Tensor]:
    """Inverse of :func:`_shard`: the full HF tensors of ``entry`` from all TP ranks' shards."""
    kind = entry.kind
    if entry.expert is not None and kind == "fc1":  # one expert's [gate; up]
        return [torch.cat(_merge(Entry(entry.mcore, entry.hf * 2, "fc1"), shards, hf_config))]
    if kind == "replicated":
        return [shards[0]]
    if kind == "column":
        return [torch.cat(list(shards), dim=0)]
    if kind == "row":
        return [torch.cat(list(shards), dim=1)]
    if kind == "vocab":
        return [torch.cat(list(shards), dim=0)[:hf_config.vocab_size]]
    if kind == "fc1":
        halves = [s.chunk(2, dim=0) for s in shards]
        return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]
    if kind == "qkv":
        groups, per_group, dim = _qkv_groups(hf_config)
        rest = shards[0].shape[1:]
        fused = torch.cat(list(shards)).reshape(groups, (per_group + 2) * dim, *rest)
        q, k, v = fused.split([per_group * dim, dim, dim], dim=1)
        return [t.reshape(-1, *rest).contiguous() for t in (q, k, v)]
    raise ValueError(f"unknown shard kind {kind!r}")


def _hf_tensors(entries: Iterable[Entry], merged_of: Callable[[Entry], Any],
                hf_config) -> Iterator[tuple[str, torch.Tensor]]:
    """``(HF name, full tensor)`` of every exported entry. ``merged_of(entry)`` gives its
    merged tensors, or for an expert entry ``{global expert: merged slice}`` (several with
    EP); HF's stacked tensor is yielded once every expert's slice is there."""
    pending: dict[str, dict[int, torch.Tensor]] = {}
    for entry in entries:
        if not entry.export:
            continue
        merged = merged_of(entry)
        if entry.expert is None:
            yield from zip(entry.hf, merged, strict=True)
            continue
        slots = pending.setdefault(entry.hf[0], {})
        slots.update(merged)
        if len(slots) == num_experts(hf_config):
            yield entry.hf[0], torch.stack([slots[e] for e in sorted(pending.pop(entry.hf[0]))])
    if pending:
        raise ValueError(f"experts missing from {sorted(pending)}")


def hf_to_megatron(hf_state_dict: dict[str, torch.Tensor], hf_config, tp_rank: int = 0,
                   tp_size: int = 1, pp_rank: int = 0, pp_size: int = 1,
                   te_layout: bool = False, vocab_divisible_by: int = 1, ep_rank: int = 0,
                   ep_size: int = 1, expert_tp_rank: int | None = None,
                   expert_tp_size: int | None = None) -> dict[str, torch.Tensor]:
    """The megatron state dict of one (TP rank, PP stage, EP rank, expert-TP rank) shard,
    built from full HF tensors (expert TP: by default the TP rank and size)."""
    dense = (tp_rank, tp_size)
    experts = dense if expert_tp_size is None else (expert_tp_rank or 0, expert_tp_size)
    return {e.mcore: _shard(e, [hf_state_dict[n] for n in e.hf], hf_config,
                            *(dense if e.expert is None else experts), vocab_divisible_by)
            for e in stage_entries(hf_config, pp_rank, pp_size, te_layout, ep_rank, ep_size)}


def _is_te_layout(keys) -> bool:
    return any(k.endswith("linear_qkv.layer_norm_weight") for k in keys)


def megatron_to_hf(tp_shards: Sequence[dict[str, torch.Tensor]], hf_config, pp_rank: int = 0,
                   pp_size: int = 1, ep_size: int = 1, tp_size: int | None = None,
                   expert_tp_size: int | None = None) -> dict[str, torch.Tensor]:
    """Full HF tensors of PP stage ``pp_rank`` from its ranks' state dicts in rank order
    (siiRL's tp-cp-ep-pp-dp): the dense tensors from the first ``tp_size`` (default
    ``len(tp_shards) // ep_size``), the experts of EP rank ``r`` from ranks
    ``r * etp ... (r + 1) * etp - 1`` (megatron's expert layout: expert TP fastest, then EP;
    ``etp = expert_tp_size``, default ``tp_size``). Stages hold disjoint HF names: merge the
    dicts of all stages for the whole model. With tied embeddings no ``lm_head.weight`` is
    produced (HF ties it)."""
    tp, te_layout = tp_size or len(tp_shards) // ep_size, _is_te_layout(tp_shards[0])
    etp = expert_tp_size or tp
    entries = [e for r in range(ep_size)
               for e in stage_entries(hf_config, pp_rank, pp_size, te_layout, r, ep_size)
               if r == 0 or e.expert is not None]
    per_rank = num_experts(hf_config) // ep_size if is_moe(hf_config) else 1

    def merged(entry: Entry):
        if entry.expert is None:
            return _merge(entry, [s[entry.mcore] for s in tp_shards[:tp]], hf_config)
        rank = entry.expert // per_rank
        shards = [s[entry.mcore] for s in tp_shards[rank * etp:(rank + 1) * etp]]
        return {entry.expert: _merge(entry, shards, hf_config)[0]}

    return dict(_hf_tensors(entries, merged, hf_config))


def load_hf_weights(model: torch.nn.Module, hf_state_dict: dict[str, torch.Tensor], hf_config,
                    tp_rank: int | None = None, tp_size: int | None = None,
                    pp_rank: int | None = None, pp_size: int | None = None,
                    vocab_divisible_by: int | None = None) -> None:
    """Copy HF weights into this rank's megatron stage, strictly (same keys and shapes).

    Ranks default to parallel_state's; ``vocab_divisible_by`` to the value the model was
    built with (:func:`~siirl.engine.megatron.model.build_gpt_model` records it)."""
    from megatron.core import parallel_state as ps

    model = unwrap_model(model)
    if vocab_divisible_by is None:
        vocab_divisible_by = getattr(model, "vocab_divisible_by", 1)
    tp_rank = ps.get_tensor_model_parallel_rank() if tp_rank is None else tp_rank
    tp_size = ps.get_tensor_model_parallel_world_size() if tp_size is None else tp_size
    pp_rank = ps.get_pipeline_model_parallel_rank() if pp_rank is None else pp_rank
    pp_size = ps.get_pipeline_model_parallel_world_size() if pp_size is None else pp_size
    state = hf_to_megatron(hf_state_dict, hf_config, tp_rank, tp_size, pp_rank, pp_size,
                           te_layout=_is_te_layout(model.state_dict()),
                           vocab_divisible_by=vocab_divisible_by, **_expert_ranks(hf_config))
    own = {k: v.shape for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    wrong = {k: (tuple(own.get(k, ())), tuple(v.shape)) for k, v in state.items()
             if own.get(k) != v.shape}
    if wrong:
        raise ValueError(f"megatron/HF shape mismatch (model, bridge): {wrong}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    # megatron layers declare (empty) ``_extra_state`` entries; nothing else may be missing
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise KeyError(f"megatron/HF key mismatch: missing={missing} unexpected={unexpected}")
    model.hf_vocab_size = hf_config.vocab_size


def _expert_ranks(hf_config) -> dict[str, int | None]:
    """This rank's EP and expert-TP ranks and sizes (megatron's parallel state; EP 0 / 1 and
    expert TP None, i.e. the TP ones, for a dense model or without a parallel state)."""
    from megatron.core import parallel_state as ps

    if not is_moe(hf_config) or not ps.model_parallel_is_initialized():
        return {"ep_rank": 0, "ep_size": 1, "expert_tp_rank": None, "expert_tp_size": None}
    return {"ep_rank": ps.get_expert_model_parallel_rank(),
            "ep_size": ps.get_expert_model_parallel_world_size(),
            "expert_tp_rank": ps.get_expert_tensor_parallel_rank(),
            "expert_tp_size": ps.get_expert_tensor_parallel_world_size()}


def iter_hf_weights(model: torch.nn.Module, hf_config, bucket_bytes: int = 512 << 20,
                    tp_group=None, pp_rank: int | None = None, pp_size: int | None = None
                    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Yield this PP stage's full HF tensors as lists ``[(name, tensor), ...]`` of at most
    ``bucket_bytes`` each (a single larger tensor gets a bucket of its own).

    TP shards are all-gathered over ``tp_group`` (default: megatron's TP group) one megatron
    parameter at a time, so at most one bucket of full tensors exists besides the sharded
    model; experts' shards over the expert-TP group instead (``tp_group`` where expert TP is
    TP), and with expert parallelism each expert slice is also all-gathered over the EP
    group.
    Collective: every rank of the TP (and EP) group must iterate in step. Tensors of the
    current bucket are fresh copies; consume (or copy) them before asking for the next one.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if tp_group is None and dist.is_initialized() and ps.model_parallel_is_initialized():
        tp_group = ps.get_tensor_model_parallel_group()
    tp_size = dist.get_world_size(tp_group) if tp_group is not None else 1
    pp_rank = ps.get_pipeline_model_parallel_rank() if pp_rank is None else pp_rank
    pp_size = ps.get_pipeline_model_parallel_world_size() if pp_size is None else pp_size
    local = {k: v for k, v in unwrap_model(model).state_dict().items()
             if isinstance(v, torch.Tensor)}

    ranks = _expert_ranks(hf_config)
    ep = {"ep_rank": ranks["ep_rank"], "ep_size": ranks["ep_size"]}
    ep_group = ps.get_expert_model_parallel_group() if ep["ep_size"] > 1 else None
    start = local_experts(hf_config, **ep).start if is_moe(hf_config) else 0
    expert_tp = (tp_group, tp_size)
    if ranks["expert_tp_size"] not in (None, tp_size):
        expert_tp = (ps.get_expert_tensor_parallel_group(), ranks["expert_tp_size"])

    def gathered(entry: Entry):
        shard = local[entry.mcore].detach()
        group, size = (tp_group, tp_size) if entry.expert is None else expert_tp
        if size > 1 and entry.kind != "replicated":
            shards = [torch.empty_like(shard) for _ in range(size)]
            dist.all_gather(shards, shard.contiguous(), group=group)
        else:
            shards = [shard.clone() if entry.kind == "replicated" else shard]
        merged = _merge(entry, shards, hf_config)
        if entry.expert is None:
            return merged
        if ep_group is None:
            return {entry.expert: merged[0]}
        # EP rank r holds the same local expert of its own block: global r * n + (e - start)
        peers = [torch.empty_like(merged[0]) for _ in range(ep["ep_size"])]
        dist.all_gather(peers, merged[0].contiguous(), group=ep_group)
        per_rank = num_experts(hf_config) // ep["ep_size"]
        return {rank * per_rank + entry.expert - start: t for rank, t in enumerate(peers)}

    # gathered lazily, one entry at a time, as the buckets fill
    entries = stage_entries(hf_config, pp_rank, pp_size, _is_te_layout(local), **ep)
    yield from buckets_of(_hf_tensors(entries, gathered, hf_config), bucket_bytes)
