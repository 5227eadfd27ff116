"""DataBuffer: peer-to-peer redistribution between stage layouts over gloo.

One spawn of 2 ranks and one of 4 ranks each run several scenarios (starting processes
dominates the cost); every rank pickles what it got to tmp_path and the parent checks
it against the source batches, rebuilt here from the same seeds. The ranks share this
machine, so rows go through shared memory unless a scenario turns that off (then gloo,
the route between nodes); both must give the same rows, bitwise, in the same order.
"""

import gc
import os
import pickle
import random
import socket
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from siirl.data_coordinator import same_node
from siirl.data_coordinator.data_buffer import DataBuffer, Layout, plan, source_labels
from siirl.data_coordinator.protocol import get_non_tensor, make_batch, non_tensor_keys
from siirl.errors import DataError

N_SAMPLES = 3  # rows per group (uid)
WIDTH = 16


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def source_batch(rank: int, groups: int, width: int = WIDTH, long: bool = False):
    """``groups`` groups of N_SAMPLES rows; ``long`` ranks get longer sequences, so the
    sources start out unbalanced. Row id ``rid`` is unique across ranks."""
    rng = random.Random(rank)
    rows = groups * N_SAMPLES
    rid = torch.arange(rows) + 1000 * rank
    lengths = [rng.randint(width // 2, width) if long else rng.randint(1, width // 4)
               for _ in range(rows)]
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths],
                        dtype=torch.long).reshape(rows, width)
    return make_batch(
        {"rid": rid, "attention_mask": mask, "input_ids": rid[:, None] * mask,
         "logp": rid[:, None].float() / 7 + torch.zeros(rows, width),
         "flag": (rid % 2 == 0)[:, None].expand(rows, 2).clone(),
         "half": rid[:, None].to(torch.bfloat16).expand(rows, 3).clone()},
        {"uid": [f"g{rank}-{i // N_SAMPLES}" for i in range(rows)],
         "text": [f"prompt {int(r)}" for r in rid],
         "extra": [{"rid": int(r), "tags": ["a", int(r)]} for r in rid]})


def plain(batch):
    """A pickle-friendly copy of a batch: field order, tensors, non-tensor values."""
    if batch is None:
        return None
    return {"keys": list(batch.keys()),  # noqa: SIM118
            "tensors": {k: batch.get(k) for k in batch.keys()  # noqa: SIM118
                        if isinstance(batch.get(k), torch.Tensor)},
            "values": {k: get_non_tensor(batch, k) for k in non_tensor_keys(batch)}}


def shm_open():
    """This process's shared-memory files: descriptors and mappings (none once every
    DataBuffer is closed or collected)."""
    gc.collect()
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{fd}")]
    with open("/proc/self/maps") as f:
        maps = [line for line in f if "siirl-databuffer" in line]
    return sum("siirl-databuffer" in fd for fd in fds) + len(maps)


def round_trip(batch, buf):
    dp2, dp1_tp2 = Layout.data_parallel(2), Layout.data_parallel(2, tp_size=2)
    mid = buf.redistribute(batch, dp2, dp1_tp2)
    end = buf.redistribute(mid, dp1_tp2, dp2)
    return {"mid": plain(mid), "end": plain(end), "sent": buf.bytes_sent,
            "rows_sent": buf.rows_sent, "shared_rows": buf.traffic.shared_rows}


def _scenarios_2(rank, out):
    dp2, dp1_tp2 = Layout.data_parallel(2), Layout.data_parallel(2, tp_size=2)
    batch = source_batch(rank, groups=4, long=rank == 0)
    out["round_trip"] = round_trip(batch, DataBuffer(timeout=30))
    out["round_trip_gloo"] = round_trip(batch, DataBuffer(shared_memory=False))
    # each source's rows as 2 runs (its share of 2 PPO mini-batches), kept apart both ways
    for name, shared in (("chunked", True), ("chunked_gloo", False)):
        buf = DataBuffer(shared_memory=shared)
        mid = buf.redistribute(batch, dp2, dp1_tp2, chunks=2)
        out[name] = {"mid": plain(mid),
                     "end": plain(buf.redistribute(mid, dp1_tp2, dp2, chunks=2))}

    # rank 1 cannot open rank 0's staging: 0 -> 1 takes gloo, 1 -> 0 shared memory
    real_open = same_node.open_peer
    if rank == 1:
        same_node.open_peer = lambda identity: None
    mixed = DataBuffer()
    got = mixed.redistribute(batch, dp2, dp1_tp2)
    same_node.open_peer = real_open
    out["mixed"] = {"got": plain(got), "shared_rows": mixed.traffic.shared_rows}
    # rank 1's staging cannot grow: its rows take gloo for this call
    if rank == 1:
        def no_memory(size):
            raise OSError(12, "no memory")
        mixed._local.staging.reserve = no_memory
    got = mixed.redistribute(batch, dp2, dp1_tp2)
    out["fallback"] = {"got": plain(got), "shared_rows": mixed.traffic.shared_rows}
    mixed.close()
    got = mixed.redistribute(batch, dp2, dp1_tp2)  # closed: gloo from now on
    out["closed"] = {"got": plain(got), "shared_rows": mixed.traffic.shared_rows}

    # empty shards: one source without rows, then none with any
    empty = source_batch(rank, groups=0)
    for name, shard in (("one_empty", batch if rank == 0 else empty), ("all_empty", empty)):
        buf = DataBuffer()
        out[name] = plain(buf.redistribute(shard, dp2, dp1_tp2))

    same = DataBuffer()
    out["same"] = {"is_same": same.redistribute(batch, dp2, dp2) is batch,
                   "bytes": same.bytes_sent + same.bytes_received, "plan": same.last_plan}

    single = DataBuffer()
    got = single.redistribute(batch, dp2, Layout((0,)))
    out["single"] = {"got": plain(got), "sent": single.bytes_sent}

    swap = DataBuffer()  # same sizes, ranks swapped: every row stays on its physical rank
    got = swap.redistribute(batch, dp2, Layout((1, 0)))
    out["swap"] = {"got": plain(got), "bytes": swap.bytes_sent + swap.bytes_received}

    errors = {}
    for name, bad, layouts in (
        ("width", source_batch(rank, 4, width=WIDTH + 4 * rank), (dp2, dp1_tp2)),
        ("groups", source_batch(rank, 3), (dp1_tp2, dp2)),  # 3 groups onto 2 ranks
    ):
        try:
            DataBuffer().redistribute(bad, *layouts)
        except DataError as err:
            errors[name] = str(err)
    out["errors"] = errors


def _scenarios_4(rank, out):
    dp4, dp2_tp2 = Layout.data_parallel(4), Layout.data_parallel(4, tp_size=2)
    buf = DataBuffer()
    batch = source_batch(rank, groups=2, long=rank < 2)
    out["4to2"] = plain(buf.redistribute(batch, dp4, dp2_tp2))
    out["4to2_shared_rows"] = buf.traffic.shared_rows
    out["4to2_gloo"] = plain(DataBuffer(shared_memory=False).redistribute(batch, dp4, dp2_tp2))
    # DP 2 -> DP 4: ranks 1 and 3 are TP peers, not sources; their batch is ignored.
    batch = source_batch(rank, groups=4, long=rank == 0) if rank in (0, 2) else None
    out["2to4"] = plain(buf.redistribute(batch, dp2_tp2, dp4))
    # Same sizes, disjoint ranks: keeping rows "in place" would be wrong here.
    batch = source_batch(rank, groups=2) if rank < 2 else None
    disjoint = DataBuffer()
    out["disjoint"] = {"got": plain(disjoint.redistribute(batch, Layout((0, 1)),
                                                          Layout((2, 3)))),
                       "sent": disjoint.bytes_sent}

    # Two "nodes", ranks {0, 1} and {2, 3}: shared memory within each, gloo across.
    real_key = same_node.node_key
    same_node.node_key = lambda: f"node{rank // 2}"
    nodes = DataBuffer()
    batch = source_batch(rank, groups=2, long=rank < 2)
    out["nodes"] = plain(nodes.redistribute(batch, dp4, dp2_tp2))
    same_node.node_key = real_key
    out["nodes_rows"] = (nodes.traffic.shared_rows, nodes.rows_sent)


def worker(rank: int, world: int, port: int, workdir: str) -> None:
    torch.set_num_threads(1)  # the ranks share a small machine
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    out: dict = {}
    dev_shm = set(os.listdir("/dev/shm"))
    try:
        (_scenarios_2 if world == 2 else _scenarios_4)(rank, out)
        # every file went with its buffer (errors included), none ever had a name
        out["files_left"] = shm_open()
        out["dev_shm_new"] = sorted(set(os.listdir("/dev/shm")) - dev_shm)
    finally:
        with open(f"{workdir}/rank{rank}.pkl", "wb") as f:
            pickle.dump(out, f)
        dist.barrier()
        dist.destroy_process_group()


def spawn(world: int, tmp_path) -> list[dict]:
    context = mp.start_processes(worker, args=(world, free_port(), str(tmp_path)),
                                 nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + 90
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the {world}-rank run did not finish in 90 s")
    return [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in range(world)]


def expected_rows(sources: dict[int, int], long) -> dict[int, dict]:
    """rid -> (row of every field) for the given {rank: groups} sources."""
    rows = {}
    for rank, groups in sources.items():
        batch = plain(source_batch(rank, groups, long=long(rank)))
        for i, rid in enumerate(batch["tensors"]["rid"].tolist()):
            rows[rid] = ({k: t[i] for k, t in batch["tensors"].items()},
                         {k: v[i] for k, v in batch["values"].items()})
    return rows


def check_parts(parts: list[dict], want: dict[int, dict]) -> None:
    """``parts`` (one per destination DP group) hold every wanted row exactly once, all
    fields intact, groups whole, equal row counts, and balanced token sums."""
    seen = [rid for p in parts for rid in p["tensors"]["rid"].tolist()]
    assert sorted(seen) == sorted(want)  # nothing lost or duplicated
    keys = ["rid", "attention_mask", "input_ids", "logp", "flag", "half", "uid", "text",
            "extra"]
    for part in parts:
        assert part["keys"] == keys
        for i, rid in enumerate(part["tensors"]["rid"].tolist()):
            tensors, values = want[rid]
            for k, t in tensors.items():
                assert part["tensors"][k].dtype == t.dtype
                assert torch.equal(part["tensors"][k][i], t), (k, rid)
            assert {k: v[i] for k, v in part["values"].items()} == values
    uids = [set(p["values"]["uid"]) for p in parts]
    assert sum(len(u) for u in uids) == len(set().union(*uids))  # groups whole
    assert len({len(p["values"]["uid"]) for p in parts}) == 1  # equal row counts
    tokens = [int(p["tensors"]["attention_mask"].sum()) for p in parts]
    assert max(tokens) / (sum(tokens) / len(tokens)) < 1.1


@pytest.fixture(autouse=True)
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_two_ranks(tmp_path):
    r0, r1 = spawn(2, tmp_path)
    want = expected_rows({0: 4, 1: 4}, long=lambda r: r == 0)

    # DP 2 -> DP 1 (tp 2): both ranks read all rows, in source rank order.
    mids = [r["round_trip"]["mid"] for r in (r0, r1)]
    for mid in mids:
        assert mid["tensors"]["rid"].tolist() == sorted(want)
        assert mid["values"]["text"] == [f"prompt {rid}" for rid in sorted(want)]
    check_parts(mids[:1], want)
    # -> DP 2 again: rebalanced (the sources started out unbalanced).
    check_parts([r["round_trip"]["end"] for r in (r0, r1)], want)
    start = [sum(int(want[rid][0]["attention_mask"].sum()) for rid in want
                 if rid // 1000 == rank) for rank in (0, 1)]
    assert max(start) / (sum(start) / 2) > 1.5
    # rank 0 is the only DP 1 source, and keeps its half of the way back
    assert r0["round_trip"]["rows_sent"] == 12 + 12 and r1["round_trip"]["rows_sent"] == 12

    for r in (r0, r1):
        assert r["same"] == {"is_same": True, "bytes": 0, "plan": None}
    assert r1["single"]["got"] is None
    assert r0["single"]["got"]["tensors"]["rid"].tolist() == sorted(want)
    assert r0["single"]["sent"] == 0 and r1["single"]["sent"] > 0
    # Layout((1, 0)): rank 0 is destination DP rank 1 and keeps exactly its own rows.
    for rank, r in enumerate((r0, r1)):
        assert r["swap"]["bytes"] == 0
        assert [rid // 1000 for rid in r["swap"]["got"]["tensors"]["rid"].tolist()] == [rank] * 12

    for r in (r0, r1):  # both ranks raise the same error instead of one of them hanging
        assert "disagree on fields" in r["errors"]["width"] and "pad" in r["errors"]["width"]
        assert "3 groups" in r["errors"]["groups"]
        assert "2 destination DP groups" in r["errors"]["groups"]
        assert r["files_left"] == 0 and r["dev_shm_new"] == []

    # the same rows, bitwise and in the same order, through shared memory or gloo
    for r in (r0, r1):
        shm, gloo = r["round_trip"], r["round_trip_gloo"]
        for step in ("mid", "end"):
            assert_same(shm[step], gloo[step])
        assert shm["rows_sent"] == gloo["rows_sent"] == shm["shared_rows"] > 0
        assert gloo["shared_rows"] == 0 and gloo["sent"] > 100 * shm["sent"]
    # chunks=2: the rows of every destination run by run, each run balanced on its own
    runs = [[rid for rid in sorted(want) if rid % 1000 // 6 == k] for k in (0, 1)]
    run_of = {rid: k for k in (0, 1) for rid in runs[k]}
    for r in (r0, r1):
        assert_same(r["chunked"]["mid"], r["chunked_gloo"]["mid"])
        assert_same(r["chunked"]["end"], r["chunked_gloo"]["end"])
        assert r["chunked"]["mid"]["tensors"]["rid"].tolist() == runs[0] + runs[1]
        got = r["chunked"]["end"]["tensors"]["rid"].tolist()
        assert [run_of[rid] for rid in got] == [0] * 6 + [1] * 6
    check_parts([r["chunked"]["end"] for r in (r0, r1)], want)

    # mixed routes (rank 1 cannot reach rank 0), a runtime fallback, a closed buffer
    assert (r0["mixed"]["shared_rows"], r1["mixed"]["shared_rows"]) == (0, 12)
    assert (r0["fallback"]["shared_rows"], r1["fallback"]["shared_rows"]) == (0, 12)
    assert (r0["closed"]["shared_rows"], r1["closed"]["shared_rows"]) == (0, 12)
    for r in (r0, r1):
        for name in ("mixed", "fallback", "closed"):
            assert_same(r[name]["got"], r["round_trip"]["mid"])

    # empty shards: a source with no rows adds none; no rows at all gives an empty batch
    rank0 = sorted(rid for rid in want if rid < 1000)
    for r in (r0, r1):
        assert r["one_empty"]["tensors"]["rid"].tolist() == rank0
        empty = r["all_empty"]
        assert empty["keys"] == r["one_empty"]["keys"]
        for key, t in r["one_empty"]["tensors"].items():
            got = empty["tensors"][key]
            assert got.dtype == t.dtype and got.shape == (0, *t.shape[1:])
        assert all(v == [] for v in empty["values"].values()) and len(empty["values"]) == 3


def assert_same(a: dict, b: dict) -> None:
    """Two results hold the same fields, rows and order, bit for bit."""
    assert a["keys"] == b["keys"] and a["values"] == b["values"]
    for key, t in a["tensors"].items():
        u = b["tensors"][key]
        assert t.dtype == u.dtype and t.shape == u.shape
        assert torch.equal(t.view(-1).view(torch.uint8), u.view(-1).view(torch.uint8)), key


def test_four_ranks(tmp_path):
    results = spawn(4, tmp_path)
    for r in results:
        assert_same(r["4to2"], r["4to2_gloo"])
        assert_same(r["nodes"], r["4to2_gloo"])
        assert r["4to2_shared_rows"] > 0
        assert r["files_left"] == 0 and r["dev_shm_new"] == []
    # rows for a node peer go through shared memory, rows for the other node over gloo
    shared, sent = (sum(r["nodes_rows"][i] for r in results) for i in (0, 1))
    assert 0 < shared < sent
    want = expected_rows({r: 2 for r in range(4)}, long=lambda r: r < 2)
    # DP 4 -> DP 2 (tp 2): TP peers get identical rows
    for a, b in ((0, 1), (2, 3)):
        assert results[a]["4to2"]["values"] == results[b]["4to2"]["values"]
        assert torch.equal(results[a]["4to2"]["tensors"]["rid"],
                           results[b]["4to2"]["tensors"]["rid"])
    check_parts([results[0]["4to2"], results[2]["4to2"]], want)

    want = expected_rows({0: 4, 2: 4}, long=lambda r: r == 0)
    check_parts([r["2to4"] for r in results], want)

    want = expected_rows({0: 2, 1: 2}, long=lambda r: False)
    assert results[0]["disjoint"]["got"] is None and results[1]["disjoint"]["got"] is None
    check_parts([results[2]["disjoint"]["got"], results[3]["disjoint"]["got"]], want)
    assert results[0]["disjoint"]["sent"] > 0 and results[1]["disjoint"]["sent"] > 0


def meta(tokens, groups=None):
    return {"tokens": tokens, "groups": groups}


def test_layout_and_plan():
    layout = Layout((4, 5, 6, 7), tp_size=2)
    assert layout.dp_size == 2 and layout.dp_rank(6) == 1 and layout.dp_rank(0) is None
    assert [layout.is_source(r) for r in (4, 5, 6, 7, 0)] == [True, False, True, False, False]
    assert layout.peers(1) == (6, 7) and layout.source_rank(1) == 6
    assert Layout.data_parallel(4, 2) == Layout((0, 1, 2, 3), 2)
    assert Layout([0, 1]) == Layout((0, 1))  # ranks normalised to a tuple
    for bad in (((0, 1, 2), 2), ((0, 0), 1), ((), 1), ((0,), 0)):
        with pytest.raises(DataError):
            Layout(*bad)

    dp2 = Layout((0, 1))
    assert source_labels(dp2, Layout((1, 0))) == ([1, 0], True)  # ranks stay: keep
    assert source_labels(dp2, Layout((2, 3))) == ([2, 3], False)  # all ranks change
    assert source_labels(dp2, Layout((0, 1), 2)) == ([0, 1], False)  # both into one group
    assert source_labels(Layout((0, 1, 2, 3), 2), Layout.data_parallel(4)) == ([0, 2], False)

    metas = [meta([5, 4, 1, 1]), meta([1, 1, 1, 1])]
    kept = plan(metas, dp2, Layout((1, 0)))
    assert kept["moved_rows"] == 0 and kept["keep_in_place"]
    assert kept["dst_rows"][1] == [(0, i) for i in range(4)]  # rank 0 is dst DP rank 1
    moved = plan(metas, dp2, Layout((2, 3)))
    assert moved["moved_rows"] == 8 and not moved["keep_in_place"]
    assert sorted(moved["dst_tokens"]) == [7, 8]  # rebalanced, 4 rows each
    assert [len(rows) for rows in moved["dst_rows"]] == [4, 4]
    # DP 2 -> DP 4 with sources on ranks 0 and 2: only rows that land on dst DP ranks 0
    # and 2 (the same physical ranks) count as staying
    spread = plan(metas, Layout((0, 2)), Layout.data_parallel(4))
    assert [len(r) for r in spread["dst_rows"]] == [2] * 4
    stay = [d for (s, _), d in spread["assignment"].items() if d == spread["labels"][s]]
    assert 0 < len(stay) == 8 - spread["moved_rows"] and set(stay) <= {0, 2}

    six_groups = [meta([1] * 9, [f"a{i // 3}" for i in range(9)]),
                  meta([1] * 9, [f"b{i // 3}" for i in range(9)])]
    with pytest.raises(DataError, match=r"18 rows \(6 groups\) from 2 source DP groups to "
                                        r"4 destination DP groups"):
        plan(six_groups, dp2, Layout.data_parallel(4))
    grouped = plan(six_groups, dp2, Layout.data_parallel(3))
    for rows in grouped["dst_rows"]:
        assert len(rows) == 6 and len({(s, i // 3) for s, i in rows}) == 2  # groups whole
