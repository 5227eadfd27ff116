import itertools
import random

import pytest

from siirl.data_coordinator.balance import (
    _hungarian,
    imbalance,
    karmarkar_karp,
    lpt,
    partition_rows,
    plan_transfers,
)
from siirl.errors import DataError


def _assert_partition(parts, n, k, per_part=None):
    assert len(parts) == k
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(n))  # nothing lost or duplicated
    assert all(p == sorted(p) for p in parts)
    if per_part is not None:
        assert all(len(p) == per_part for p in parts)


@pytest.mark.parametrize("fn", [karmarkar_karp, lpt])
@pytest.mark.parametrize("seed", range(20))
def test_random_partitions_are_complete_and_equal_sized(fn, seed):
    rng = random.Random(seed)
    k = rng.randint(1, 6)
    n = k * rng.randint(0, 12)
    w = [rng.randint(0, 2000) for _ in range(n)]
    _assert_partition(fn(w, k), n, k, n // k)
    _assert_partition(fn(w, k, equal_size=False), n, k)


def test_hypothesis_kk_unequal_size():
    hyp = pytest.importorskip("hypothesis")  # optional dev dependency
    st = hyp.strategies

    @hyp.settings(max_examples=60, deadline=None)
    @hyp.given(st.lists(st.integers(0, 5000), max_size=40), st.integers(1, 5))
    def check(w, k):
        parts = karmarkar_karp(w, k, equal_size=False)
        _assert_partition(parts, len(w), k)
        if w and sum(w):  # LDM is within 2x of the trivial lower bound
            assert max(sum(w[i] for i in p) for p in parts) <= max(max(w), sum(w) / k) * 2

    check()


def test_kk_balance_on_skewed_lengths():
    rng = random.Random(0)
    w = [rng.randint(10, 1000) for _ in range(64)]
    kk, greedy = karmarkar_karp(w, 4), lpt(w, 4)
    order = sorted(range(64), key=lambda i: w[i])
    contiguous = [order[i * 16 : (i + 1) * 16] for i in range(4)]  # naive sorted split
    assert imbalance(kk, w) < 1.05
    assert imbalance(greedy, w) < 1.05
    assert imbalance(contiguous, w) > 1.5
    assert imbalance(kk, w) <= imbalance(greedy, w) + 0.02


def test_kk_beats_round_robin_on_heavy_tail():
    rng = random.Random(1)
    # a few very long responses among many short ones, in an unlucky order
    w = [rng.randint(10, 100) for _ in range(60)] + [4000, 3900, 3800, 3700]
    w = [x for pair in zip(w[:32], w[32:], strict=True) for x in pair]
    round_robin = [list(range(p, 64, 4)) for p in range(4)]
    assert imbalance(karmarkar_karp(w, 4), w) < 1.05 < imbalance(round_robin, w)


def test_partition_rows_keeps_groups_whole():
    rng = random.Random(2)
    gids = [f"g{i // 4}" for i in range(48)]  # 12 groups of 4
    toks = [rng.randint(10, 1000) for _ in range(48)]
    for method in ("karmarkar_karp", "lpt"):
        parts = partition_rows(toks, 3, gids, method=method)
        _assert_partition(parts, 48, 3, 16)
        owner = {}
        for p, part in enumerate(parts):
            for r in part:
                assert owner.setdefault(gids[r], p) == p
        assert imbalance(parts, toks) < 1.1


def test_errors():
    with pytest.raises(DataError, match="7 items into 2 parts"):
        karmarkar_karp([1] * 7, 2)
    with pytest.raises(DataError, match="k >= 1"):
        lpt([1, 2], 0)
    with pytest.raises(DataError, match=r"sizes \[1, 2\]"):
        partition_rows([1, 1, 1], 1, ["a", "a", "b"])
    with pytest.raises(DataError, match="3 groups into 2 parts"):
        partition_rows([1] * 6, 2, ["a", "a", "b", "b", "c", "c"])
    with pytest.raises(DataError, match="unknown balance method"):
        partition_rows([1, 2], 2, method="nope")
    with pytest.raises(DataError, match="repeated: 'x'"):
        plan_transfers([[("x", 1, None)], [("x", 2, None)]], 2)
    with pytest.raises(DataError, match="dst_size"):
        plan_transfers([[("x", 1, None)]], 0)


def _layout(rng, ranks, rows_per_rank, group=2):
    out, g = [], 0
    for s in range(ranks):
        rows = []
        for j in range(rows_per_rank):
            rows.append((f"r{s}_{j}", rng.randint(10, 1000), f"g{g + j // group}"))
        g += rows_per_rank // group
        out.append(rows)
    return out


def _check_plan(src, dst_size, plan):
    keys = [r[0] for rows in src for r in rows]
    assert sorted(plan["assignment"]) == sorted(keys)
    sent = [k for ks in plan["sends"].values() for k in ks]
    assert sorted(sent) == sorted(keys)
    assert sorted(k for d in plan["dst_rows"] for k in d) == sorted(keys)
    src_of = {r[0]: s for s, rows in enumerate(src) for r in rows}
    assert plan["moved_rows"] == sum(src_of[k] != d for k, d in plan["assignment"].items())
    for (s, d), ks in plan["sends"].items():
        assert all(src_of[k] == s and plan["assignment"][k] == d for k in ks)
    gid = {r[0]: r[2] for rows in src for r in rows}
    owner = {}
    for k, d in plan["assignment"].items():
        assert owner.setdefault(gid[k], d) == d
    tok = {r[0]: r[1] for rows in src for r in rows}
    assert plan["dst_tokens"] == [sum(tok[k] for k in d) for d in plan["dst_rows"]]


def test_same_layout_keeps_rows_in_place():
    src = _layout(random.Random(3), 2, 8)
    plan = plan_transfers(src, 2)
    _check_plan(src, 2, plan)
    assert plan["moved_rows"] == 0
    assert set(plan["sends"]) == {(0, 0), (1, 1)}


def test_two_to_one_to_two():
    src = _layout(random.Random(4), 2, 8)
    down = plan_transfers(src, 1)
    _check_plan(src, 1, down)
    assert down["moved_rows"] == 8  # exactly rank 1's rows travel
    merged = [[r for rows in src for r in rows]]
    up = plan_transfers(merged, 2)
    _check_plan(merged, 2, up)
    assert up["moved_rows"] == 8 and [len(d) for d in up["dst_rows"]] == [8, 8]
    assert max(up["dst_tokens"]) / (sum(up["dst_tokens"]) / 2) < 1.05


def test_four_to_two():
    src = _layout(random.Random(5), 4, 8)
    plan = plan_transfers(src, 2)
    _check_plan(src, 2, plan)
    assert [len(d) for d in plan["dst_rows"]] == [16, 16]
    assert 16 <= plan["moved_rows"] < 32  # ranks 2 and 3 must move; relabel keeps some
    assert max(plan["dst_tokens"]) / (sum(plan["dst_tokens"]) / 2) < 1.05


@pytest.mark.parametrize("seed", range(15))
def test_relabel_is_optimal_and_rebalances(seed):
    rng = random.Random(seed)
    n_src, n_dst = rng.randint(1, 4), rng.randint(1, 4)
    src = _layout(rng, n_src, 2 * n_dst * rng.randint(1, 3))
    plan = plan_transfers(src, n_dst, keep_in_place=False)
    _check_plan(src, n_dst, plan)
    src_of = {r[0]: s for s, rows in enumerate(src) for r in rows}
    for perm in itertools.permutations(range(n_dst)):  # no relabelling moves fewer rows
        moved = sum(src_of[k] != perm[d] for k, d in plan["assignment"].items())
        assert moved >= plan["moved_rows"]


def test_hungarian_matches_brute_force():
    rng = random.Random(6)
    for n in range(1, 6):
        cost = [[rng.randint(-9, 9) for _ in range(n)] for _ in range(n)]
        col = _hungarian(cost)
        best = min(sum(cost[r][p[r]] for r in range(n)) for p in itertools.permutations(range(n)))
        assert sorted(col) == list(range(n))
        assert sum(cost[r][col[r]] for r in range(n)) == best


def test_imbalance():
    assert imbalance([[0], [1]], [3, 1]) == 1.5
    assert imbalance([[0], []], [0]) == 1.0


def test_chunks_are_balanced_apart_and_listed_run_by_run():
    """Two sources of 2 runs of 2 groups each onto 2 destinations: every destination gets
    two groups of each run, the first run's first; rows that do not split into runs (or
    groups that straddle them) are balanced as one run."""
    def source(s, tokens):
        return [((s, i), t, f"{s}-{i // 2}") for i, t in enumerate(tokens)]

    src = [source(0, [9, 9, 1, 1, 5, 5, 2, 2]), source(1, [1, 1, 9, 9, 2, 2, 5, 5])]
    plan = plan_transfers(src, 2, keep_in_place=False, chunks=2)
    assert plan["runs"] == 2
    for rows in plan["dst_rows"]:
        assert [i // 4 for _, i in rows] == [0] * 4 + [1] * 4
    assert sorted(k for d in plan["dst_rows"] for k in d) == sorted(r[0] for s in src for r in s)
    assert plan["dst_tokens"] == [34, 34]
    whole = plan_transfers(src, 2, keep_in_place=False)
    assert whole["runs"] == 1
    # 3 groups a source: a group would straddle the runs
    odd = [[((s, i), 1, f"{s}-{i // 2}") for i in range(6)] for s in (0, 1)]
    assert plan_transfers(odd, 2, keep_in_place=False, chunks=2)["runs"] == 1
    # one group a run does not split over 2 destinations: one run
    one = [[((s, i), 1, f"{s}-{i // 2}") for i in range(4)] for s in (0,)]
    assert plan_transfers(one, 2, keep_in_place=False, chunks=2)["runs"] == 1
