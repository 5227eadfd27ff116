"""Full Hugging Face weights of the whole pipeline, bucket by bucket, on every stage.

The rollout engine on each worker needs every layer, but a pipeline stage holds only its
own. :func:`iter_pipeline_hf_weights` walks the stages in order: the ranks of stage ``s``
gather their TP shards into HF tensors (``bridge.iter_hf_weights``: bounded buckets) and
broadcast each bucket over the pipeline group, so at most one bucket of full tensors is in
flight besides the sharded model. Collective over the TP and PP groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from siirl.engine.megatron.bridge import iter_hf_weights
from siirl.engine.megatron.chunks import model_chunks, stage_of
from siirl.engine.megatron.stages import PipelineStages

Bucket = list[tuple[str, torch.Tensor]]


def iter_pipeline_hf_weights(model: torch.nn.Module, hf_config: Any, bucket_bytes: int,
                             tp_group: Any = None, stages: PipelineStages | None = None,
                             chunk_view: Callable[[torch.nn.Module], torch.nn.Module] | None
                             = None) -> Iterator[Bucket]:
    """``chunk_view``: what the bridge reads in place of each chunk (its ``state_dict``:
    the LoRA merged weights, ``lora_state.MergedView``)."""
    stages = stages or PipelineStages()
    if stages.size == 1:
        yield from _own_buckets(model, hf_config, bucket_bytes, tp_group, chunk_view)
        return
    device = next(model.parameters()).device
    for stage in range(stages.size):
        src = stages.global_rank(stage)
        if stage == stages.rank:
            for bucket in _own_buckets(model, hf_config, bucket_bytes, tp_group, chunk_view):
                _send(bucket, src, stages.group)
                yield bucket
            _send(None, src, stages.group)
        else:
            while (bucket := _receive(src, stages.group, device)) is not None:
                yield bucket


def _own_buckets(model: torch.nn.Module, hf_config: Any, bucket_bytes: int,
                 tp_group: Any, chunk_view: Callable | None = None) -> Iterator[Bucket]:
    """The HF tensors of this rank's stage (all its virtual-pipeline chunks)."""
    for index, chunk in enumerate(model_chunks(model)):
        stage, stages = stage_of(model, index)
        view = chunk if chunk_view is None else chunk_view(chunk)
        yield from iter_hf_weights(view, hf_config, bucket_bytes, tp_group=tp_group,
                                   pp_rank=stage, pp_size=stages)


def _send(bucket: Bucket | None, src: int, group: Any) -> None:
    layout = None if bucket is None else [(name, tuple(t.shape), t.dtype) for name, t in bucket]
    dist.broadcast_object_list([layout], src=src, group=group)
    if bucket is not None:  # as bytes: one message whatever the dtypes
        flat = torch.cat([t.contiguous().view(-1).view(torch.uint8) for _, t in bucket])
        dist.broadcast(flat, src=src, group=group)


def _receive(src: int, group: Any, device: torch.device) -> Bucket | None:
    holder = [None]
    dist.broadcast_object_list(holder, src=src, group=group)
    layout = holder[0]
    if layout is None:
        return None
    sizes = [_nbytes(shape, dtype) for _, shape, dtype in layout]
    flat = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    dist.broadcast(flat, src=src, group=group)
    out, offset = [], 0
    for (name, shape, dtype), size in zip(layout, sizes, strict=True):
        # clone: a byte slice at an odd offset cannot be viewed as a wider dtype in place
        out.append((name, flat[offset:offset + size].clone().view(dtype).view(shape)))
        offset += size
    return out


def _nbytes(shape: tuple, dtype: torch.dtype) -> int:
    size = torch.empty((), dtype=dtype).element_size()
    for dim in shape:
        size *= dim
    return size
