"""Weights as a stream of named-tensor buckets (``siirl.engine.common.weight_sync``) and the
fsdp backend's export of them."""

import torch

from siirl.engine.common.weight_sync import buckets_of, copy_into
from siirl.engine.fsdp.backend import FSDPBackend


def test_buckets_are_bounded_and_keep_every_tensor_in_order():
    named = [(f"w{i}", torch.zeros(10)) for i in range(5)]  # 40 bytes each
    buckets = list(buckets_of(named, bucket_bytes=100))
    assert [len(b) for b in buckets] == [2, 2, 1]
    assert [n for b in buckets for n, _ in b] == [n for n, _ in named]
    big = list(buckets_of([("big", torch.zeros(100))], bucket_bytes=16))
    assert len(big) == 1  # a tensor larger than a bucket travels alone


def test_copy_into_loads_a_models_exported_weights():
    source, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    moved = copy_into(target, FSDPBackend(source).export_weights(bucket_bytes=16))
    assert moved == sum(p.numel() * 4 for p in source.parameters())
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(),
                                                 target.state_dict().values(), strict=True))
