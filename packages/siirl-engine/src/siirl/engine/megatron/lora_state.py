"""The megatron LoRA adapters (``siirl.engine.megatron.lora``) as whole-model tensors: the
adapters keyed as peft's ``adapter_model.safetensors`` on the HF model, and the weights with
the adapters merged as full HF tensors for the rollout and the HF export.

Each pipeline stage holds its own layers' adapters, split over TP like the base weights, so
the adapter state is gathered over TP, then over the pipeline stages (every rank gets all of
it); reading it back, each rank keeps its stage's layers and its TP part. The merged weights
go through ``weight_sync.iter_pipeline_hf_weights`` with each chunk's merged state in place
of its own, so every stage receives every stage's merged tensors as for full weights.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from siirl.engine.megatron.lora import FUSED, LoraSettings, adapted_layers, hf_name, tp_layout


@torch.no_grad()
def merged_state(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The stage's state dict with ``W + s * B @ A`` in each adapted weight (this rank's
    part; new tensors, the model is unchanged) and no adapter keys: what the bridge
    converts to HF tensors for the rollout."""
    from siirl.engine.megatron.model import unwrap_model

    layers = adapted_layers(model)
    state = {}
    for key, value in unwrap_model(model).state_dict().items():
        if ".lora." in key or not isinstance(value, torch.Tensor):
            continue
        owner = layers.get(key.removesuffix(".weight"))
        if owner is not None and key.endswith(".weight"):
            value = value + owner.lora.weight_delta().to(value.dtype)
        state[key] = value
    return state


def _gather(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    from megatron.core import parallel_state as ps

    _, tp = tp_layout()
    if tp == 1:
        return tensor.detach().clone()
    parts = [torch.empty_like(tensor) for _ in range(tp)]
    dist.all_gather(parts, tensor.detach().contiguous(),
                    group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=dim)


def _over_stages(local: Any) -> List[Any]:
    """``local`` of every pipeline stage (``[local]`` with one stage)."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        return [local]
    group = ps.get_pipeline_model_parallel_group()
    everyone: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, local, group=group)
    return everyone


def _pairs(model: torch.nn.Module) -> Iterator[Tuple[torch.nn.Module, str, str]]:
    for linear in adapted_layers(model).values():
        hf_dir, projections, _ = FUSED[linear.lora_suffix]
        for proj in projections:
            if proj in linear.lora.lora_A:
                yield linear, hf_dir, proj


@torch.no_grad()
def adapter_state(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The full adapters of every stage keyed as peft's file keys on the HF model, on CPU
    (collective over TP and PP)."""
    state = {}
    for linear, hf_dir, proj in _pairs(model):
        adapters = linear.lora
        a, b = adapters.lora_A[proj], adapters.lora_B[proj]
        if adapters.kind == "row":
            a = _gather(a, 1)
        else:
            b = _gather(b, 0)
        state[hf_name(linear.lora_layer, hf_dir, proj, "A")] = a.cpu()
        state[hf_name(linear.lora_layer, hf_dir, proj, "B")] = b.detach().cpu().clone()
    return {key: tensor for stage in _over_stages(state) for key, tensor in stage.items()}


@torch.no_grad()
def load_adapter_state(model: torch.nn.Module, state: Dict[str, torch.Tensor]) -> None:
    """Copy full (HF-keyed) adapters of the whole model into this rank's parts (its stage's
    layers, its TP part); names and shapes are checked first (a mismatch raises KeyError /
    ValueError naming the tensor). Collective over PP."""
    tp_rank, tp = tp_layout()
    copies = []
    for linear, hf_dir, proj in _pairs(model):
        adapters = linear.lora
        for which, param in (("A", adapters.lora_A[proj]), ("B", adapters.lora_B[proj])):
            key = hf_name(linear.lora_layer, hf_dir, proj, which)
            if key not in state:
                raise KeyError(f"{key} is missing")
            full = state[key]
            split = (adapters.kind, which) in (("row", "A"), ("column", "B"))
            part = full.chunk(tp, dim=1 if which == "A" else 0)[tp_rank] if split else full
            if tuple(part.shape) != tuple(param.shape):
                raise ValueError(f"{key} is {list(full.shape)}, the model's part is "
                                 f"{list(param.shape)} at TP={tp}")
            copies.append((param, part))
    own = {hf_name(lin.lora_layer, d, p, w) for lin, d, p in _pairs(model) for w in "AB"}
    unexpected = set(state) - set().union(*_over_stages(own))  # no stage holds them
    if unexpected:
        raise KeyError(f"{len(unexpected)} unexpected tensor(s), e.g. {sorted(unexpected)[0]}")
    for param, part in copies:
        param.copy_(part.to(param.device, param.dtype))


def peft_config(settings: LoraSettings, base_model: str | None = None) -> Any:
    """peft's ``LoraConfig`` equal to these adapters (for ``adapter_config.json``)."""
    from siirl.engine.models.lora import import_peft

    return import_peft().LoraConfig(
        r=settings.rank, lora_alpha=settings.alpha, target_modules=list(settings.targets),
        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
        base_model_name_or_path=base_model)


class MergedView(torch.nn.Module):
    """A stand-in for one model chunk whose ``state_dict`` is :func:`merged_state`: what
    ``bridge.iter_hf_weights`` reads to export the merged HF weights."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self._merged = merged_state(model)

    def state_dict(self, *args: Any, **kwargs: Any) -> Dict[str, torch.Tensor]:
        return self._merged


def iter_merged_hf_weights(model: torch.nn.Module, hf_config, bucket_bytes: int,
                           tp_group: Any = None, stages: Optional[Any] = None
                           ) -> Iterator[List[Tuple[str, torch.Tensor]]]:
    """The merged model's full HF tensors of every stage in buckets, on every rank
    (collective over TP and PP; ``stages``: a ``PipelineStages``, built if None)."""
    from siirl.engine.megatron.weight_sync import iter_pipeline_hf_weights

    yield from iter_pipeline_hf_weights(model, hf_config, bucket_bytes, tp_group=tp_group,
                                        stages=stages, chunk_view=MergedView)
