"""DataBuffer: move a batch between two DAG stages with different data-parallel layouts.

There is no central process holding data. ``redistribute`` is a collective over a
process group:

1. every rank all-gathers a small metadata record (its layouts, its shared-memory file,
   and on source ranks the field schema, per-row token counts and group ids): metadata,
   never rows;
2. every rank computes the same deterministic plan with ``balance.plan_transfers``:
   rows balanced by tokens into equal row counts per destination DP group, groups whole;
3. each source sends each destination DP group exactly its rows, directly to every rank
   of that group (TP/PP peers all read the same rows); rows that stay on the same
   physical rank are not sent. A reader on the source's node copies them out of the
   source's shared-memory staging file (``same_node``; only a 4-int note crosses the
   transport); a reader on another node gets them point to point (``transport``).
   ``shared_memory=False`` or ``SIIRL_DATABUFFER_SHM=0`` sends every pair the latter way.

Validation problems found on one rank travel in the metadata, so every rank raises the
same ``DataError`` instead of some ranks waiting forever on a send that never comes.
Tensor fields must have the same dtype and trailing shape on every source: pad to a
common width before redistributing (no implicit padding here). The result lives on the
transport device (cpu for gloo, the current cuda device for nccl: call
``torch.cuda.set_device`` first, as NCCL's object collectives need it); each row is copied
once into it, large cpu fields on transparent huge pages where the kernel offers them
(``huge_pages``). ``close()`` releases the shared-memory files before the buffer is
collected.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from tensordict import TensorDict
from tensordict.utils import is_non_tensor

from siirl.data_coordinator import huge_pages
from siirl.data_coordinator.balance import plan_transfers
from siirl.data_coordinator.fields import ATTENTION_MASK, UID
from siirl.data_coordinator.protocol import batch_num_tokens, get_non_tensor, set_non_tensor
from siirl.data_coordinator.same_node import (
    WRITTEN,
    SameNode,
    copy_rows,
    run_start,
    staged_groups,
)
from siirl.data_coordinator.transport import Piece, Traffic, exchange, signal, transport_device
from siirl.errors import DataError

__all__ = ["DataBuffer", "Layout", "plan", "source_labels"]


@dataclass(frozen=True)
class Layout:
    """Ranks of one stage: `ranks` (global ranks, ordered) grouped into data-parallel groups of
    `tp_size` consecutive ranks (tensor/pipeline-parallel peers) that all read the same rows."""

    ranks: tuple[int, ...]
    tp_size: int = 1

    def __post_init__(self):
        object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))
        if not self.ranks or len(set(self.ranks)) != len(self.ranks):
            raise DataError(f"a layout needs distinct ranks, got {self.ranks}")
        if self.tp_size < 1 or len(self.ranks) % self.tp_size:
            raise DataError(f"{len(self.ranks)} ranks do not split into groups of "
                            f"tp_size={self.tp_size}")

    @property
    def dp_size(self) -> int:
        return len(self.ranks) // self.tp_size

    def dp_rank(self, rank: int) -> int | None:
        """DP group of ``rank``, or None if the rank is not in this layout."""
        return self.ranks.index(rank) // self.tp_size if rank in self.ranks else None

    def is_source(self, rank: int) -> bool:
        """True for the first rank of its model-parallel group: the one that hands rows on."""
        return rank in self.ranks and self.ranks.index(rank) % self.tp_size == 0

    def peers(self, dp_rank: int) -> tuple[int, ...]:
        return self.ranks[dp_rank * self.tp_size : (dp_rank + 1) * self.tp_size]

    def source_rank(self, dp_rank: int) -> int:
        return self.ranks[dp_rank * self.tp_size]

    @classmethod
    def data_parallel(cls, world_size: int, tp_size: int = 1) -> Layout:
        return cls(tuple(range(world_size)), tp_size)


def source_labels(src: Layout, dst: Layout) -> tuple[list[int], bool]:
    """Index each source takes in ``plan_transfers``, and whether rows may stay in place.

    ``plan_transfers`` assumes source index i and destination index i are the same
    place. So a source whose physical rank belongs to destination DP group d takes label
    d (the first such source; one per group); the others take labels >= dst.dp_size,
    which never count as overlap. Keeping rows in place is only right when every source
    got its own destination group, and the sizes match.
    """
    labels: list[int | None] = [None] * src.dp_size
    taken, spare = set(), dst.dp_size
    for s in range(src.dp_size):
        d = dst.dp_rank(src.source_rank(s))
        if d is not None and d not in taken:
            labels[s] = d
            taken.add(d)
    for s in range(src.dp_size):
        if labels[s] is None:
            labels[s], spare = spare, spare + 1
    return labels, len(taken) == src.dp_size == dst.dp_size


def plan(metas: list[dict], src: Layout, dst: Layout, method: str = "karmarkar_karp",
         chunks: int = 1) -> dict:
    """The transfer plan from the sources' metadata (``metas[s]`` for source DP rank s).

    Row keys are ``(source dp rank, row position)``. Adds ``labels`` and
    ``keep_in_place`` to ``plan_transfers``' result.
    """
    labels, keep = source_labels(src, dst)
    src_rows: list[list] = [[] for _ in range(max(labels) + 1)]
    for s, meta in enumerate(metas):
        groups = meta["groups"] or [None] * len(meta["tokens"])
        src_rows[labels[s]] = [((s, i), t, g) for i, (t, g) in
                               enumerate(zip(meta["tokens"], groups, strict=True))]
    try:
        out = plan_transfers(src_rows, dst.dp_size, keep_in_place=keep, method=method,
                             chunks=chunks)
    except DataError as err:
        rows = sum(len(m["tokens"]) for m in metas)
        groups = len({g for m in metas for g in (m["groups"] or [])})
        raise DataError(f"cannot move {rows} rows ({groups} groups) from {src.dp_size} "
                        f"source DP groups to {dst.dp_size} destination DP groups: {err}") \
            from err
    out.update(labels=labels, keep_in_place=keep)
    return out


def _schema(batch: TensorDict) -> list[tuple]:
    fields = []
    for key in batch.keys():  # noqa: SIM118 (iterating a TensorDict gives rows)
        value = batch.get(key)
        if isinstance(value, torch.Tensor):
            fields.append((key, "tensor", value.dtype, tuple(value.shape[1:])))
        elif is_non_tensor(value):
            fields.append((key, "values", None, None))
        else:
            raise DataError(f"field {key!r} ({type(value).__name__}) cannot be redistributed; "
                            "only tensor and non-tensor fields are supported")
    return fields


def _source_meta(batch, token_key: str, group_key: str | None) -> dict:
    if not isinstance(batch, TensorDict) or len(batch.batch_size) != 1:
        raise DataError(f"a source rank needs a TensorDict batch with batch_size [B], got "
                        f"{type(batch).__name__}")
    if token_key in batch.keys():  # noqa: SIM118
        tokens = batch_num_tokens(batch, token_key).tolist()
    else:  # no mask: balance by row count
        tokens = [1] * batch.batch_size[0]
    groups = None
    if group_key is not None and group_key in batch.keys():  # noqa: SIM118
        value = batch.get(group_key)
        groups = value.tolist() if isinstance(value, torch.Tensor) else \
            get_non_tensor(batch, group_key)
    return {"schema": _schema(batch), "tokens": tokens, "groups": groups}


def _check_schemas(metas: list[dict], src: Layout) -> list[tuple]:
    first = metas[0]["schema"]
    for s, meta in enumerate(metas[1:], start=1):
        if meta["schema"] != first:
            want = {f[0]: f[1:] for f in first}
            got = {f[0]: f[1:] for f in meta["schema"]}
            diff = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
            raise DataError(
                f"source ranks {src.source_rank(0)} and {src.source_rank(s)} disagree on "
                f"fields {diff}: {[want.get(k) for k in diff]} vs {[got.get(k) for k in diff]}"
                " (tensor fields need the same dtype and trailing shape; pad to one width)")
    return first


def _take(batch: TensorDict, rows: list[int], schema: list[tuple]) -> Piece:
    """Rows of ``batch`` as a Piece; a contiguous run is a view (no copy)."""
    start = run_start(rows) if rows else 0
    index = None if start is not None else torch.tensor(rows, dtype=torch.long)
    piece = Piece(len(rows))
    for key, kind, _, _ in schema:
        if kind == "tensor":
            t = batch.get(key)
            if start is not None:
                piece.tensors[key] = t.narrow(0, start, len(rows))
            else:
                piece.tensors[key] = t.index_select(0, index.to(t.device))
        else:
            values = get_non_tensor(batch, key)
            piece.values[key] = [values[i] for i in rows]
    return piece


def _assemble(parts: list, schema: list[tuple], device: torch.device) -> TensorDict:
    """Join ``parts`` in order: Pieces, or ``(batch, rows)`` of this rank's own batch.
    Each row is copied once, straight into the result; a lone part that is not a view
    into a staging file is used as it is (a contiguous run of the own batch: a view)."""
    if len(parts) == 1 and isinstance(parts[0], tuple):
        parts = [_take(*parts[0], schema)]
    counts = [len(p[1]) if isinstance(p, tuple) else p.rows for p in parts]
    out = TensorDict({}, batch_size=[sum(counts)])
    for key, kind, dtype, trailing in schema:
        if kind != "tensor":
            set_non_tensor(out, key, [v for p in parts for v in _values(p, key)])
        elif len(parts) == 1 and not parts[0].shared:
            out.set(key, parts[0].tensors[key].to(device))
        else:
            joined = huge_pages.empty((sum(counts), *trailing), dtype, device)
            at = 0
            for part, rows in zip(parts, counts, strict=True):
                if isinstance(part, tuple):
                    copy_rows(joined.narrow(0, at, rows), part[0].get(key), part[1])
                else:
                    joined.narrow(0, at, rows).copy_(part.tensors[key])
                at += rows
            out.set(key, joined)
    return out


def _values(part, key: str) -> list:
    if isinstance(part, Piece):
        return part.values[key]
    values = get_non_tensor(part[0], key)
    return [values[i] for i in part[1]]


class DataBuffer:
    """Peer-to-peer redistribution of batches between stage layouts (see module doc)."""

    def __init__(self, group=None, *, method: str = "karmarkar_karp",
                 timeout: timedelta | float | None = None, shared_memory: bool | None = None):
        """``shared_memory``: move rows between ranks of one node through shared memory
        (None: on unless the environment sets ``SIIRL_DATABUFFER_SHM=0``)."""
        self.group = group
        self.method = method
        if isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=timeout)
        self.timeout = timeout  # None: the group's own timeout
        self.traffic = Traffic()
        self.last_plan: dict | None = None
        self._local = SameNode(shared_memory)

    def close(self) -> None:
        """Release the shared-memory files now rather than when the buffer is collected."""
        self._local.close()

    @property
    def bytes_sent(self) -> int:
        return self.traffic.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.traffic.bytes_received

    @property
    def rows_sent(self) -> int:
        return self.traffic.rows_sent

    def redistribute(self, batch: TensorDict | None, src: Layout, dst: Layout, *,
                     group_key: str | None = UID,
                     token_key: str = ATTENTION_MASK, chunks: int = 1) -> TensorDict | None:
        """Hand ``batch`` (rows held by ``src``'s source ranks) on to ``dst``; returns this
        rank's rows under ``dst`` (None if the rank is not in it). A collective: every rank
        of the group calls it, in the same order. Same layouts: returns ``batch`` itself.
        ``chunks``: each source's rows are that many runs, kept apart and in order
        (``balance.plan_transfers``), so that PPO mini-batches stay those of one worker."""
        if src == dst:
            return batch  # rows already sit where the next stage reads them
        group = self.group if self.group is not None else dist.group.WORLD
        members = dist.get_process_group_ranks(group)  # in group-rank order
        outside = sorted(set(src.ranks + dst.ranks) - set(members))
        if outside:
            raise DataError(f"layout ranks {outside} are not in the DataBuffer's group")
        me = dist.get_rank()
        device = transport_device(self.group)
        meta: dict = {"layouts": (src, dst), **self._local.announce(device.type == "cpu")}
        if src.is_source(me):
            try:
                meta.update(_source_meta(batch, token_key, group_key))
            except DataError as err:
                meta["error"] = str(err)
        # pickled once here, so the counter costs no second serialisation (the all-gather
        # pickles the bytes object, which is a plain copy)
        record = pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)
        self.traffic.meta_bytes += len(record)
        gathered: list = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(gathered, record, group=self.group)
        gathered = [pickle.loads(g) for g in gathered]
        by_rank = dict(zip(members, gathered, strict=True))
        self._check(by_rank, src, dst)
        metas = [by_rank[src.source_rank(s)] for s in range(src.dp_size)]
        schema = _check_schemas(metas, src)
        self.last_plan = the_plan = plan(metas, src, dst, self.method, chunks)
        routes = self._local.routes(by_rank, members, self.group)

        pairs: dict[tuple[int, int], list[int]] = {}  # (src dp, dst dp) -> row positions
        for d, keys in enumerate(the_plan["dst_rows"]):
            for s, i in sorted(keys):
                pairs.setdefault((s, d), []).append(i)
        readers = {d: dst.peers(d) for d in range(dst.dp_size)}
        my_src = src.dp_rank(me) if src.is_source(me) else None
        sends, notes = self._send(batch, pairs, readers, routes, schema, my_src)
        my_dst = dst.dp_rank(me)
        order = [s for s in range(src.dp_size) if (s, my_dst) in pairs]
        senders = [src.source_rank(s) for s in order if src.source_rank(s) != me]
        got = signal(notes, [r for r in senders if (r, me) in routes], width=4,
                     group=self.group, timeout=self.timeout, traffic=self.traffic)
        written = {r for r, note in got.items() if note[0] == WRITTEN}
        received = exchange(sends, [r for r in senders if r not in written], group=self.group,
                            device=device, timeout=self.timeout, traffic=self.traffic)
        if my_dst is None:
            return None
        parts = []
        for s in order:
            rank = src.source_rank(s)
            if rank == me:
                parts.append((batch, pairs[(s, my_dst)]))
            elif rank in written:
                groups = [(d, len(rows)) for d, rows in
                          staged_groups(s, pairs, readers, routes, rank)]
                parts.append(self._local.read(rank, groups, my_dst, schema, got[rank]))
            else:
                parts.append(received[rank])
        rows = _assemble(parts, schema, device)
        if the_plan["runs"] > 1:  # assembled by (source, position); laid out run by run
            counts = [len(m["tokens"]) for m in metas]
            assembled = sorted(the_plan["dst_rows"][my_dst])
            by_run = sorted(range(len(assembled)), key=lambda j: (
                assembled[j][1] * the_plan["runs"] // counts[assembled[j][0]], assembled[j]))
            rows = rows[torch.tensor(by_run, dtype=torch.long)]
        return rows

    def _send(self, batch, pairs: dict, readers: dict, routes: set, schema: list[tuple],
              my_src: int | None) -> tuple[dict[int, Piece], dict[int, list[int]]]:
        """Stage rows for same-node readers; the Pieces for the transport and the notes."""
        sends: dict[int, Piece] = {}
        notes: dict[int, list[int]] = {}
        if my_src is None:
            return sends, notes
        me = dist.get_rank()
        staged, nbytes = self._local.stage(
            batch, staged_groups(my_src, pairs, readers, routes, me), schema)
        self.traffic.shared_bytes += nbytes
        for (s, d), rows in pairs.items():
            if s != my_src:
                continue
            shm = [p for p in readers[d] if p != me and (me, p) in routes]
            notes.update({p: staged[d] for p in shm})
            if shm and staged[d][0] == WRITTEN:
                self.traffic.rows_sent += len(rows) * len(shm)
                self.traffic.shared_rows += len(rows) * len(shm)
                shm = []  # no transport for them
            wire = shm + [p for p in readers[d] if p != me and (me, p) not in routes]
            if wire:
                piece = _take(batch, rows, schema)  # one selection shared by the TP peers
                sends.update({p: piece for p in wire})
        return sends, notes

    @staticmethod
    def _check(by_rank: dict[int, dict], src: Layout, dst: Layout) -> None:
        # Every rank sees the same records, so every rank raises the same error.
        for rank, meta in sorted(by_rank.items()):
            if meta["layouts"] != (src, dst):
                raise DataError(f"rank {rank} called redistribute with layouts "
                                f"{meta['layouts']}, this rank with {(src, dst)}")
        errors = [f"rank {r}: {m['error']}" for r, m in sorted(by_rank.items()) if "error" in m]
        if errors:
            raise DataError("redistribute failed on source ranks: " + "; ".join(errors))
