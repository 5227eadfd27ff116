"""The DataBuffer scenarios of test_data_buffer.py with forked ranks, for mutation testing.

``nox -s mutmut -- data_buffer`` runs the DataBuffer's tests once per mutant. The ranks of
test_data_buffer.py are spawned (a fresh interpreter importing torch each: seconds per
run); forked ranks start at once and, being forks of the test process, run the mutated
module it imported. Same scenarios, same checks; plus the checks of what every rank is
told when the ranks disagree.
"""

import multiprocessing
import os
import pickle
import time
from datetime import timedelta

import pytest
import test_data_buffer as base
import torch
import torch.distributed as dist

from siirl.data_coordinator.data_buffer import DataBuffer, Layout
from siirl.errors import DataError


def _run(target, world: int, tmp_path) -> list[dict]:
    """Fork ``world`` ranks; a rank that fails stops them all at once (the others would
    wait for it until the group's timeout)."""
    port = base.free_port()
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=target, args=(r, world, port, str(tmp_path)))
                 for r in range(world)]
    for process in processes:
        process.start()
    deadline = time.monotonic() + 30  # a mutant that deadlocks the ranks fails here
    failed = False
    while any(p.is_alive() for p in processes) and time.monotonic() < deadline:
        if any(p.exitcode not in (None, 0) for p in processes):
            failed = True
            break
        time.sleep(0.02)
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join()
    if failed or any(p.exitcode != 0 for p in processes):
        pytest.fail(f"a rank of the {world}-rank run failed or did not finish in 30 s: "
                    f"exit codes {[p.exitcode for p in processes]}")
    return [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in range(world)]


def _worker(rank: int, world: int, port: int, workdir: str) -> None:
    """test_data_buffer.worker, failing fast: a rank that raises leaves at once, and the
    group's timeout (what a rank waiting for a message that never comes waits) is 10 s."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=10))
    out: dict = {}
    dev_shm = set(os.listdir("/dev/shm"))
    try:
        (base._scenarios_2 if world == 2 else base._scenarios_4)(rank, out)
        out["files_left"] = base.shm_open()
        out["dev_shm_new"] = sorted(set(os.listdir("/dev/shm")) - dev_shm)
    except BaseException:
        os._exit(1)
    with open(f"{workdir}/rank{rank}.pkl", "wb") as f:
        pickle.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture
def forked(monkeypatch):
    """test_data_buffer's ``spawn`` forking instead; the ranks' results are kept."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs the fork start method")
    results = []

    def spawn(world, tmp_path):
        results.append(_run(_worker, world, tmp_path))
        return results[-1]

    monkeypatch.setattr(base, "spawn", spawn)
    return results


def test_two_ranks_forked(forked, tmp_path):
    base.test_two_ranks(tmp_path)
    for r in forked[0]:  # the schema error names the two sources and the fields
        assert r["errors"]["width"].startswith(
            "source ranks 0 and 1 disagree on fields ['attention_mask', 'input_ids', "
            "'logp']: [('tensor', torch.int64, (16,)), ('tensor', torch.int64, (16,)), "
            "('tensor', torch.float32, (16,))] vs [('tensor', torch.int64, (20,))")


def test_four_ranks_forked(forked, tmp_path):
    base.test_four_ranks(tmp_path)
    for r in forked[0]:  # row counters count rows (a row read by two TP peers counts twice)
        assert isinstance(r["4to2_shared_rows"], int)
        assert all(isinstance(n, int) for n in r["nodes_rows"])


def _disagreeing(rank: int, world: int, port: int, workdir: str) -> None:
    """Each rank calls redistribute wrongly in its own way; all must raise, none hang."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=30))
    out: dict = {}
    dp2, dp1_tp2 = Layout.data_parallel(2), Layout.data_parallel(2, tp_size=2)
    batch = base.source_batch(rank, groups=2)
    try:
        cases = {
            # rank 1 names other layouts than rank 0
            "layouts": (batch, dp2, dp1_tp2 if rank == 0 else Layout((1, 0))),
            # rank 1's batch is no TensorDict
            "source": (batch if rank == 0 else {"x": 1}, dp2, dp1_tp2),
            # a layout with a rank outside the group
            "outside": (batch, dp2, Layout((0, 1, 2, 3))),
        }
        for name, (shard, src, dst) in cases.items():
            try:
                DataBuffer().redistribute(shard, src, dst)
                out[name] = None
            except DataError as err:
                out[name] = str(err)
        # rank 1 has a field rank 0 lacks: the error names it
        extra = base.source_batch(rank, groups=2)
        if rank == 1:
            extra["only_here"] = torch.zeros(6)
        try:
            DataBuffer().redistribute(extra, dp2, dp1_tp2)
            out["extra_field"] = None
        except DataError as err:
            out["extra_field"] = str(err)
        # the bytes staged in shared memory add up over calls
        twice = DataBuffer()
        twice.redistribute(batch, dp2, dp1_tp2)
        once = twice.traffic.shared_bytes
        twice.redistribute(batch, dp2, dp1_tp2)
        out["shared_bytes"] = (once, twice.traffic.shared_bytes)
        twice.close()
        # a rank in neither layout's destination gets None, and the counters move
        buf = DataBuffer(timeout=30.0)
        got = buf.redistribute(batch, dp2, Layout((0,)))
        out["single"] = (got is None, buf.bytes_sent, buf.bytes_received, buf.rows_sent,
                         buf.traffic.meta_bytes > 0, buf.timeout)
        buf.close()
    finally:
        with open(os.path.join(workdir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(out, f)
        dist.barrier()
        dist.destroy_process_group()


def test_every_rank_is_told_why_a_redistribute_fails(forked, tmp_path):
    r0, r1 = _run(_disagreeing, 2, tmp_path)
    for me, r in enumerate((r0, r1)):  # each names the first rank that differs from it
        assert r["layouts"].startswith(f"rank {1 - me} called redistribute with layouts")
        assert r["source"] == r0["source"]
        assert r["source"].startswith("redistribute failed on source ranks: rank 1: ")
        assert "TensorDict" in r["source"] and "rank 0" not in r["source"]
        assert "layout ranks [2, 3] are not in the DataBuffer's group" == r["outside"]
    for r in (r0, r1):
        assert "disagree on fields ['only_here']" in r["extra_field"]
        once, total = r["shared_bytes"]
        assert total == 2 * once
    assert r0["shared_bytes"][0] > 0  # rank 0 stages its rows for rank 1
    none0, sent0, received0, rows0, meta0, timeout0 = r0["single"]
    none1, sent1, received1, rows1, meta1, _ = r1["single"]
    assert not none0 and none1  # rank 1 is not in Layout((0,))
    assert sent1 > 0 and received0 == sent1 and rows1 == 6 and sent0 == 0
    assert meta0 and meta1 and timeout0 == timedelta(seconds=30)


# ---- a process subgroup, the balance method, group and token keys, counters -------------

def _in_a_subgroup(rank: int, world: int, port: int, workdir: str) -> None:
    """Three ranks; the DataBuffer works in the subgroup {1, 2} while rank 0 stays out."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=10))
    group = dist.new_group([1, 2])  # every rank takes part in creating it
    out: dict = {}
    try:
        if rank in (1, 2):
            src, dst = Layout((1, 2)), Layout((1, 2), tp_size=2)
            batch = base.source_batch(rank, groups=2, long=rank == 1)
            buf = DataBuffer(group)
            out["got"] = base.plain(buf.redistribute(batch, src, dst))
            first = buf.traffic.meta_bytes
            # no attention_mask: rows are balanced by count; a tensor of group ids
            del batch["attention_mask"]
            batch["gid"] = torch.arange(6) // 3 + 10 * rank
            back = buf.redistribute(base.source_batch(rank, groups=2) if rank == 1 else None,
                                    dst, src, group_key="gid_missing")
            out["back_rows"] = None if back is None else back.batch_size[0]
            buf.redistribute(batch, src, Layout((2, 1)), group_key="gid")
            out["plan_by_rows"] = buf.last_plan["dst_tokens"]
            out["meta_grows"] = buf.traffic.meta_bytes > 2 * first
            # another mask to balance by: all ones, 16 tokens a row
            weighed = base.source_batch(rank, groups=2)
            weighed["ones"] = torch.ones_like(weighed["attention_mask"])
            buf.redistribute(weighed, src, Layout((2, 1)), token_key="ones")
            out["plan_by_ones"] = buf.last_plan["dst_tokens"]
            try:
                DataBuffer(group, method="no_such_method").redistribute(batch, src, dst,
                                                                         group_key="gid")
            except DataError as err:
                out["method"] = str(err)
    except BaseException:
        os._exit(1)
    with open(os.path.join(workdir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def test_a_data_buffer_works_within_its_own_process_group(forked, tmp_path):
    r0, r1, r2 = _run(_in_a_subgroup, 3, tmp_path)
    assert r0 == {}
    want = base.expected_rows({1: 2, 2: 2}, long=lambda r: r == 1)
    for r in (r1, r2):  # DP 2 -> DP 1 (tp 2): both read every row, in source order
        assert r["got"]["tensors"]["rid"].tolist() == sorted(want)
    assert (r1["back_rows"], r2["back_rows"]) == (3, 3)
    for r in (r1, r2):
        assert sorted(r["plan_by_rows"]) == [6, 6]  # row counts, not tokens
        assert sorted(r["plan_by_ones"]) == [96, 96]  # 6 rows of 16 tokens each
        assert r["meta_grows"]
        assert "unknown balance method 'no_such_method'" in r["method"]


def test_the_first_dp_group_has_its_own_peers_and_unknown_methods_are_refused():
    from siirl.data_coordinator.data_buffer import plan

    assert Layout((4, 5, 6, 7), tp_size=2).peers(0) == (4, 5)
    metas = [{"tokens": [1, 2], "groups": None}, {"tokens": [3, 4], "groups": None}]
    with pytest.raises(DataError, match="unknown balance method 'x'"):
        plan(metas, Layout((0, 1)), Layout((2, 3)), method="x")


def _silent_peer(rank: int, world: int, port: int, workdir: str, shared: bool) -> None:
    """Rank 1 takes part in the metadata exchange, then neither signals nor sends for 2 s;
    rank 0, whose DataBuffer times out after 0.5 s, must give up after about that long
    (the group's own timeout is 10 s). ``shared``: the rows would come through shared
    memory (rank 0 waits in ``signal``) or over gloo (in ``exchange``)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=10))
    import siirl.data_coordinator.data_buffer as module

    if rank == 1:
        module.signal = module.exchange = lambda *a, **k: time.sleep(2) or {}
    batch = base.source_batch(rank, groups=2)
    start, error = time.monotonic(), None
    try:
        DataBuffer(timeout=0.5, shared_memory=shared).redistribute(
            batch, Layout.data_parallel(2), Layout.data_parallel(2, tp_size=2))
    except Exception as err:  # noqa: BLE001 (gloo's timeout error)
        error = type(err).__name__
    with open(os.path.join(workdir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump({"waited": (time.monotonic() - start, error)}, f)
    os._exit(0)  # the group is in an undefined state after a timeout


@pytest.mark.parametrize("shared", [True, False], ids=["signal", "exchange"])
def test_a_rank_whose_peer_goes_silent_gives_up_after_the_buffers_timeout(forked, tmp_path,
                                                                          shared):
    def target(rank, world, port, workdir):
        _silent_peer(rank, world, port, workdir, shared)

    r0, _ = _run(target, 2, tmp_path)
    elapsed, error = r0["waited"]
    assert error is not None and elapsed < 1.8, (elapsed, error)
