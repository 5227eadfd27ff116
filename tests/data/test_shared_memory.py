"""The DataBuffer's shared-memory route, piece by piece, in one process (plus one child
process that maps a parent's staging file). The route end to end, across ranks, is in
test_data_buffer.py."""

import multiprocessing as mp
import os

import pytest
import torch

from siirl.data_coordinator import same_node, shared_memory
from siirl.data_coordinator.data_buffer import _assemble, _schema
from siirl.data_coordinator.protocol import get_non_tensor, make_batch
from siirl.data_coordinator.same_node import (
    FALLBACK,
    WRITTEN,
    SameNode,
    copy_rows,
    staged_groups,
    tensor_layout,
)
from siirl.data_coordinator.shared_memory import Staging, enabled, node_key, open_peer

pytestmark = pytest.mark.skipif(node_key() is None, reason="needs Linux memfd and /proc")


def batch(rows: int = 10):
    rid = torch.arange(rows)
    return make_batch({"rid": rid, "x": rid[:, None].float().expand(rows, 3).clone(),
                       "flag": (rid % 2 == 0)[:, None].expand(rows, 5).clone(),
                       "half": rid[:, None].to(torch.bfloat16).expand(rows, 7).clone()},
                      {"uid": [f"u{i // 2}" for i in range(rows)],
                       "extra": [{"i": i} for i in range(rows)]})


def test_setting(monkeypatch):
    monkeypatch.delenv(shared_memory.ENV, raising=False)
    assert enabled() and enabled(True) and not enabled(False)
    for off in ("0", "false", "OFF", " no "):
        monkeypatch.setenv(shared_memory.ENV, off)
        assert not enabled() and enabled(True)
        assert not SameNode().on and SameNode(True).on
    monkeypatch.setenv(shared_memory.ENV, "1")
    assert enabled() and not SameNode(False).on


def test_staging_grows_and_peers_see_it():
    staging = Staging()
    pid, fd, _, _ = staging.identity
    assert pid == os.getpid() and "memfd:siirl-databuffer" in os.readlink(f"/proc/self/fd/{fd}")
    staging.reserve(100)
    size = os.fstat(fd).st_size
    assert size >= 100 and size % shared_memory.PAGE == 0
    staging.reserve(size + 1)  # grows by at least a quarter
    assert os.fstat(fd).st_size >= size * 5 // 4
    staging.write(10, b"hello")
    peer = open_peer(staging.identity)  # this process stands in for a peer
    assert peer is not None and peer.read(10, 5) == b"hello"
    staging.tensor(20)[:5] = torch.tensor([1, 2, 3, 4, 5], dtype=torch.uint8)
    assert peer.tensor(5)[:5].tolist() == [1, 2, 3, 4, 5]
    staging.reserve(10 * size)  # the peer remaps when it needs more than it mapped
    staging.write(9 * size, b"far")
    assert peer.read(9 * size, 3) == b"far"
    peer.close()
    staging.close()
    assert not os.path.exists(f"/proc/self/fd/{fd}") or "siirl" not in os.readlink(
        f"/proc/self/fd/{fd}")


def test_open_peer_refuses_the_wrong_file():
    staging = Staging()
    pid, fd, dev, ino = staging.identity
    assert open_peer((pid, fd, dev, ino + 1)) is None  # another file under that number
    assert open_peer((pid, 10**6, dev, ino)) is None  # no such descriptor
    assert open_peer((2**22 + 12345, fd, dev, ino)) is None  # no such process
    staging.close()


def _child_writes(identity, queue):
    peer = open_peer(identity)
    peer.write(0, b"from the child")
    queue.put(os.getpid())
    peer.close()


def test_another_process_writes_into_the_staging():
    staging = Staging()
    staging.reserve(64)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_writes, args=(staging.identity, queue))
    child.start()
    assert queue.get(timeout=60) != os.getpid()
    child.join(60)
    assert child.exitcode == 0
    assert staging.read(0, 14) == b"from the child"
    staging.close()


def test_copy_rows_and_layout():
    src = torch.arange(40).reshape(10, 4)
    for rows in ([], [3, 4, 5], [7, 1, 1, 9], list(range(10))):
        out = torch.full((len(rows), 4), -1)
        ptr = out.data_ptr()
        copy_rows(out, src, rows)
        assert torch.equal(out, src[rows]) and out.data_ptr() == ptr  # written in place
    out = torch.empty(2, 4, dtype=torch.float64)
    copy_rows(out, src, [2, 0])  # another dtype: converted as copy_ does
    assert torch.equal(out, src[[2, 0]].double())

    schema = _schema(batch())
    layout, end = tensor_layout(schema, [(0, 3), (2, 5)])
    regions = sorted((off, off + torch.Size(shape).numel() * dtype.itemsize)
                     for group in layout.values() for off, dtype, shape in group.values())
    assert all(start % same_node.ALIGN == 0 for start, _ in regions)
    assert all(a[1] <= b[0] for a, b in zip(regions, regions[1:], strict=False))  # no overlap
    assert regions[-1][1] <= end and set(layout) == {0, 2}
    assert layout[2]["half"][1:] == (torch.bfloat16, (5, 7))


def test_staged_groups():
    pairs = {(0, 0): [0, 1], (0, 1): [2, 3], (1, 1): [0]}
    readers = {0: (0, 1), 1: (2, 3)}
    # source 0 sits on rank 0: group 0's other reader (1) and group 1's (2, 3) over shm
    assert staged_groups(0, pairs, readers, {(0, 1), (0, 2)}, 0) == [(0, [0, 1]), (1, [2, 3])]
    # rank 0 reads its own rows from its batch: no staging for a group only it reads
    assert staged_groups(0, pairs, {0: (0,), 1: (1,)}, {(0, 1)}, 0) == [(1, [2, 3])]
    assert staged_groups(0, pairs, readers, set(), 0) == []


def test_stage_read_assemble():
    b, local = batch(), SameNode(True)
    local.announce(True)
    schema = _schema(b)
    groups = [(1, [1, 2, 3]), (3, [8, 0])]
    notes, nbytes = local.stage(b, groups, schema)
    assert set(notes) == {1, 3} and all(n[0] == WRITTEN for n in notes.values())
    assert nbytes >= 5 * (8 + 12 + 5 + 14)
    local.peers[0] = open_peer(local.staging.identity)  # read back as a peer would
    counts = [(d, len(rows)) for d, rows in groups]
    piece = local.read(0, counts, 3, schema, notes[3])
    assert piece.shared and piece.rows == 2 and piece.values["uid"] == ["u4", "u0"]
    for key in ("rid", "x", "flag", "half"):
        assert torch.equal(piece.tensors[key], b.get(key)[[8, 0]])

    # a lone shared piece is copied out (the staging is written again next time) ...
    out = _assemble([piece], schema, torch.device("cpu"))
    assert out.get("rid").tolist() == [8, 0]
    notes, _ = local.stage(b, [(3, [5, 6])], schema)
    assert out.get("rid").tolist() == [8, 0] and out.get("x")[0, 0] == 8
    piece = local.read(0, [(3, 2)], 3, schema, notes[3])
    # ... while a contiguous run of the own batch stays a view, as before
    view = _assemble([(b, [2, 3, 4])], schema, torch.device("cpu"))
    assert view.get("rid").data_ptr() == b.get("rid")[2:].data_ptr()
    joined = _assemble([(b, [9, 1]), piece], schema, torch.device("cpu"))
    assert joined.get("rid").tolist() == [9, 1, 5, 6]
    assert get_non_tensor(joined, "extra") == [{"i": 9}, {"i": 1}, {"i": 5}, {"i": 6}]

    def no_memory(size):
        raise OSError(12, "no memory")

    local.staging.reserve = no_memory  # the staging cannot grow: every group falls back
    notes, nbytes = local.stage(b, groups, schema)
    assert nbytes == 0 and [n[:2] for n in notes.values()] == [[FALLBACK, 3], [FALLBACK, 2]]
    local.close()
    assert local.staging is None and not local.peers and local.announce(True)["shm"] is None
