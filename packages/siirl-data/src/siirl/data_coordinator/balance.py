"""Pure planning algorithms for the DataBuffer's row redistribution (no torch.distributed).

Every worker runs the same deterministic plan on the same metadata (row keys, token
counts, group ids gathered from all ranks), so the ranks agree on who sends what
without a coordinator. Hence: no randomness, and ties are broken by index.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Hashable, Sequence

from siirl.errors import DataError

__all__ = ["imbalance", "karmarkar_karp", "lpt", "partition_rows", "plan_transfers"]


def _check(weights: Sequence[float], k: int, equal_size: bool) -> None:
    if k < 1:
        raise DataError(f"need k >= 1 parts, got {k}")
    if equal_size and len(weights) % k:
        raise DataError(f"cannot split {len(weights)} items into {k} parts of equal size")
    if any(w < 0 for w in weights):
        raise DataError("weights (token counts) must be non-negative")


def karmarkar_karp(weights: Sequence[float], k: int, equal_size: bool = True) -> list[list[int]]:
    """k-way largest differencing method; returns k sorted index lists.

    A state is k partial parts sorted by sum, descending. The two states with the largest
    spread (max - min sum) are merged by pairing the heaviest part of one with the
    lightest of the other, which cancels most of both spreads. With ``equal_size`` the
    initial states are k-tuples of consecutive items in sorted order (one item per part),
    so every merge keeps all parts at the same item count.
    """
    _check(weights, k, equal_size)
    if k == 1:  # nothing to balance
        return [list(range(len(weights)))]
    order = sorted(range(len(weights)), key=weights.__getitem__)  # stable: ties by index
    if equal_size:
        seeds = [order[o : o + k] for o in range(0, len(order), k)]
    else:
        seeds = [[i] for i in order]
    # A part's items are a tree of pairs (leaves: indices), flattened once at the end:
    # concatenating lists at every merge would make the method quadratic in the items.
    heap: list = []
    for tick, seed in enumerate(seeds):
        state = [(weights[i], i) for i in seed] + [(0, ())] * (k - len(seed))
        state.sort(key=_SUM, reverse=True)  # stable sort: equal sums keep index order
        heapq.heappush(heap, (-(state[0][0] - state[-1][0]), tick, state))
    tick = len(seeds)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(x[0] + y[0], (x[1], y[1])) for x, y in zip(a, reversed(b), strict=True)]
        merged.sort(key=_SUM, reverse=True)
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tick, merged))
        tick += 1
    if not heap:
        return [[] for _ in range(k)]
    return [sorted(_leaves(items)) for _, items in heap[0][2]]


_SUM = operator.itemgetter(0)


def _leaves(tree) -> list[int]:
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, tuple):
            stack.extend(node)
        else:
            out.append(node)
    return out


def lpt(weights: Sequence[float], k: int, equal_size: bool = True) -> list[list[int]]:
    """Greedy longest-processing-time: heaviest item first onto the lightest open part.

    With ``equal_size`` a part is closed once it holds n/k items (the count cap).
    """
    _check(weights, k, equal_size)
    cap = len(weights) // k if equal_size else len(weights)
    parts: list[list[int]] = [[] for _ in range(k)]
    sums = [0.0] * k
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        p = min((q for q in range(k) if len(parts[q]) < cap), key=lambda q: (sums[q], q))
        parts[p].append(i)
        sums[p] += weights[i]
    return [sorted(p) for p in parts]


_METHODS = {"karmarkar_karp": karmarkar_karp, "lpt": lpt}


def partition_rows(
    token_counts: Sequence[int],
    k: int,
    group_ids: Sequence[Hashable] | None = None,
    method: str = "karmarkar_karp",
) -> list[list[int]]:
    """Split rows into k parts of equal row count with balanced token sums.

    With ``group_ids`` each group (e.g. the n samples of one prompt, needed together for
    GRPO advantages) is one item weighing its token sum, so it lands whole in one part.
    Groups must all have the same size, else equal group counts would not give equal
    row counts. Rows within a part are ascending.
    """
    if method not in _METHODS:
        raise DataError(f"unknown balance method {method!r}; choose from {sorted(_METHODS)}")
    if group_ids is None:
        return _METHODS[method](list(token_counts), k, equal_size=True)
    if len(group_ids) != len(token_counts):
        raise DataError(f"{len(group_ids)} group ids for {len(token_counts)} rows")
    members: dict[Hashable, list[int]] = {}  # first-appearance order, for determinism
    for row, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(row)
    groups = list(members.values())
    sizes = sorted({len(g) for g in groups})
    if len(sizes) > 1:
        raise DataError(f"groups must all have the same size to balance rows; got sizes {sizes}")
    if len(groups) % max(k, 1):
        raise DataError(f"cannot split {len(groups)} groups into {k} parts of equal size")
    weights = [sum([token_counts[r] for r in g]) for g in groups]
    parts = _METHODS[method](weights, k, equal_size=True)
    return [sorted([r for gi in part for r in groups[gi]]) for part in parts]


def _hungarian(cost: Sequence[Sequence[float]]) -> list[int]:
    """Min-cost perfect matching on a square matrix (O(n^3) potentials method).

    Returns ``col[row]``. scipy is not a dependency, and k (ranks) is small.
    """
    n = len(cost)
    inf = float("inf")
    u, v = [0.0] * (n + 1), [0.0] * (n + 1)
    match, way = [0] * (n + 1), [0] * (n + 1)  # match[col] = row, 1-based; 0 = free
    for row in range(1, n + 1):
        match[0], j0 = row, 0
        minv, used = [inf] * (n + 1), [False] * (n + 1)
        while True:
            used[j0] = True
            i0, delta, j1 = match[j0], inf, 0
            for j in range(1, n + 1):
                if not used[j]:
                    cur = cost[i0 - 1][j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j], way[j] = cur, j0
                    if minv[j] < delta:
                        delta, j1 = minv[j], j
            for j in range(n + 1):
                if used[j]:
                    u[match[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if match[j0] == 0:
                break
        while j0:  # augment along the alternating path
            j1 = way[j0]
            match[j0] = match[j1]
            j0 = j1
    col = [0] * n
    for j in range(1, n + 1):
        col[match[j] - 1] = j - 1
    return col


def plan_transfers(
    src_rows: Sequence[Sequence[tuple]],
    dst_size: int,
    *,
    keep_in_place: bool = True,
    method: str = "karmarkar_karp",
    chunks: int = 1,
) -> dict:
    """Plan which rows each destination rank receives.

    ``src_rows[s]`` lists ``(row_key, tokens, group_id)`` held by source rank s; keys are
    unique across ranks, and ``group_id`` None means a row with no group.

    Rule: if ``keep_in_place`` and the source and destination layouts have the same size,
    nothing moves (the DataBuffer keeps batches in place between nodes with the same
    layout; each rank keeps its own counts). Otherwise the rows are first balanced by
    tokens into ``dst_size`` parts of equal row count, groups whole (``partition_rows``),
    then the parts are relabelled to destination ranks by a max-overlap matching
    (Hungarian on overlap[part][rank] = rows of the part already held by source ``rank``),
    which minimises moved rows for that partition.

    With ``chunks`` c > 1 each source's rows are c equal consecutive runs (the loader's
    share of each PPO mini-batch, ``siirl.data_coordinator.dataloader``): the k-th runs of
    all sources are balanced among themselves, and every destination lists its rows run by
    run, so its k-th mini-batch holds rows of the sources' k-th runs only. Where the runs do
    not split so (a source's row count or a run's groups do not divide evenly) the rows are
    balanced as one run.

    Returns ``assignment`` {row_key: dst}, ``sends`` {(src, dst): [row_keys]} including
    ``(s, s)`` entries for rows that stay, ``moved_rows`` (rows with src != dst),
    ``dst_tokens`` per destination, ``dst_rows``: each destination's keys run by run, and
    ``runs``: how many runs were balanced apart (1 when ``chunks`` could not be kept).
    """
    if dst_size < 1:
        raise DataError(f"need dst_size >= 1, got {dst_size}")
    keys, tokens, groups, src_of = [], [], [], []
    for s, rows in enumerate(src_rows):
        for row in rows:
            if len(row) != 3:
                raise DataError(f"rank {s} row {row!r} is not (row_key, tokens, group_id)")
        keys += [row[0] for row in rows]
        tokens += [row[1] for row in rows]
        groups += [row[2] for row in rows]
        src_of += [s] * len(rows)
    if len(set(keys)) != len(keys):
        dups = sorted({repr(x) for x in keys if keys.count(x) > 1})[:5]
        raise DataError(f"row keys must be unique across ranks; repeated: {', '.join(dups)}")
    if chunks > 1 and not (keep_in_place and len(src_rows) == dst_size):
        runs = _runs(src_rows, chunks)
        if runs is not None:
            try:
                return _joined([plan_transfers(run, dst_size, keep_in_place=False,
                                               method=method) for run in runs])
            except DataError:
                pass  # a run's groups do not split over the destinations: one run
    if keep_in_place and len(src_rows) == dst_size:
        dst_of = list(src_of)
    else:
        gids = None
        if any(g is not None for g in groups):
            # A None-group row is its own singleton group; the size check then reports
            # the mix of sizes instead of silently splitting real groups.
            gids = [g if g is not None else ("__ungrouped__", i) for i, g in enumerate(groups)]
        parts = partition_rows(tokens, dst_size, gids, method)
        overlap = [[0] * dst_size for _ in parts]
        for p, part in enumerate(parts):
            for i in part:
                if src_of[i] < dst_size:
                    overlap[p][src_of[i]] += 1
        col = _hungarian([[-c for c in row] for row in overlap])
        dst_of = [0] * len(keys)
        for p, part in enumerate(parts):
            for i in part:
                dst_of[i] = col[p]
    sends: dict[tuple[int, int], list] = {}
    dst_rows: list[list] = [[] for _ in range(dst_size)]
    dst_tokens = [0] * dst_size
    # keys are in (source rank, source position) order
    for key, s, d, t in zip(keys, src_of, dst_of, tokens, strict=True):
        sends.setdefault((s, d), []).append(key)
        dst_rows[d].append(key)
        dst_tokens[d] += t
    return {
        "assignment": dict(zip(keys, dst_of, strict=True)),
        "sends": sends,
        "moved_rows": sum(s != d for s, d in zip(src_of, dst_of, strict=True)),
        "dst_tokens": dst_tokens,
        "dst_rows": dst_rows,
        "runs": 1,
    }


def _runs(src_rows: Sequence[Sequence[tuple]], chunks: int) -> list | None:
    """The sources' rows as ``chunks`` lists of per-source consecutive runs, or None when a
    source's rows do not split into equal runs or a group straddles two runs."""
    if any(len(rows) % chunks for rows in src_rows):
        return None
    runs = [[list(rows[k * len(rows) // chunks:(k + 1) * len(rows) // chunks])
             for rows in src_rows] for k in range(chunks)]
    run_of: dict = {}
    for k, run in enumerate(runs):
        for rows in run:
            for _, _, group in rows:
                if group is not None and run_of.setdefault(group, k) != k:
                    return None
    return runs


def _joined(plans: list[dict]) -> dict:
    """One plan from the plans of consecutive runs: each destination's rows run by run."""
    size = len(plans[0]["dst_rows"])
    sends: dict[tuple[int, int], list] = {}
    for one in plans:
        for pair, keys in one["sends"].items():
            sends.setdefault(pair, []).extend(keys)
    return {
        "assignment": {k: d for one in plans for k, d in one["assignment"].items()},
        "sends": sends,
        "moved_rows": sum(one["moved_rows"] for one in plans),
        "dst_tokens": [sum(one["dst_tokens"][d] for one in plans) for d in range(size)],
        "dst_rows": [[k for one in plans for k in one["dst_rows"][d]] for d in range(size)],
        "runs": len(plans),
    }


def imbalance(parts: Sequence[Sequence[int]], weights: Sequence[float]) -> float:
    """Max part sum / mean part sum (1.0 is perfect; all-zero weights count as perfect)."""
    if not parts:
        raise DataError("imbalance needs at least one part")
    sums = [sum(weights[i] for i in p) for p in parts]
    mean = sum(sums) / len(sums)
    return max(sums) / mean if mean > 0 else 1.0
