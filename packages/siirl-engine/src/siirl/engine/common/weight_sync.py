"""Weight sync from a training backend to a rollout engine, as a stream of buckets.

A trainer exports its weights as HF-named full tensors grouped into buckets of bounded
size (``export_weights(bucket_bytes)``, a generator, so nothing is gathered until a
consumer asks); a rollout engine takes the stream (``load_weights(buckets) -> bytes``).
The same stream suits an in-process copy (the ``hf`` rollout), and an inference server
(vLLM, SGLang) that receives named tensors.
"""

from __future__ import annotations

from typing import Iterable, Iterator, List, Tuple

import torch

Bucket = List[Tuple[str, torch.Tensor]]
DEFAULT_BUCKET_BYTES = 64 << 20


def buckets_of(named: Iterable[Tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[Bucket]:
    """Group ``(name, tensor)`` pairs into buckets of at most ``bucket_bytes`` (a tensor
    larger than that travels alone)."""
    bucket: Bucket = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


@torch.no_grad()
def copy_into(module: torch.nn.Module, buckets: Iterable[Bucket]) -> int:
    """Copy each named tensor into ``module``'s parameter or buffer of that name; the
    bytes copied. Names the module lacks are skipped (e.g. a tied weight's alias)."""
    targets = dict(module.named_parameters())
    targets.update(dict(module.named_buffers()))
    copied = 0
    for bucket in buckets:
        for name, tensor in bucket:
            target = targets.get(name)
            if target is not None:
                target.copy_(tensor)
                copied += tensor.numel() * tensor.element_size()
    return copied
