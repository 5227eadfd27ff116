"""Large DataBuffer results on transparent huge pages: same tensors, other memory."""

import pickle

import torch

from siirl.data_coordinator import huge_pages


def test_large_result_on_huge_pages(monkeypatch):
    monkeypatch.setattr(huge_pages, "on_request", lambda: True)
    for dtype in (torch.int64, torch.bfloat16, torch.bool):
        rows = huge_pages.MIN_BYTES // (8 * dtype.itemsize) + 3
        t = huge_pages.empty((rows, 8), dtype, torch.device("cpu"))
        assert t.shape == (rows, 8) and t.dtype == dtype and t.is_contiguous()
        assert t.data_ptr() % huge_pages.HUGE == 0  # starts on a huge-page boundary
        src = torch.arange(rows * 8).reshape(rows, 8).to(dtype)
        t.copy_(src)
        assert torch.equal(t, src)
        assert torch.equal(pickle.loads(pickle.dumps(t)), src)  # travels as any tensor
        t.share_memory_()  # as a DataLoader worker or torch.multiprocessing would
        assert t.is_shared() and torch.equal(t, src)


def test_small_or_unavailable_stays_torch_empty(monkeypatch):
    monkeypatch.setattr(huge_pages, "on_request", lambda: True)
    small = huge_pages.empty((4, 8), torch.float32, torch.device("cpu"))
    assert small.untyped_storage().resizable()  # torch's own allocation
    monkeypatch.setattr(huge_pages, "on_request", lambda: False)
    big = huge_pages.empty((huge_pages.MIN_BYTES, 1), torch.uint8, torch.device("cpu"))
    assert big.untyped_storage().resizable()
    empty = huge_pages.empty((0, 5), torch.int64, torch.device("cpu"))
    assert empty.shape == (0, 5)
