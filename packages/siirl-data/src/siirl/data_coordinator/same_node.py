"""The DataBuffer's route for ranks on one node: rows through shared memory.

Route agreement, with no extra round in the steady state: every rank's metadata record
(the all-gather the DataBuffer does anyway) carries its staging file's identity and node
key, and which peers' files it has opened. A (sender, reader) pair uses shared memory
when both are on one node and the reader holds the sender's current file; every rank
computes the same set from the same records. When some reader has not yet tried a
peer's current file (on the first transfer), every rank sees that, opens what it lacks,
and one more all-gather of what each could open follows. A peer that cannot be opened
(another user, another pid namespace, a hardened /proc) is tried once, then left to the
transport.

A transfer: the sender writes each destination group's rows into its staging file once
(TP peers of the group read the same bytes), at offsets every rank derives from the plan;
the non-tensor values follow, pickled. A 4-int note over the transport tells each reader
"written" (and where the pickled values are), or "falling back" when the staging could not
grow, in which case the rows go over the transport as for any other pair. The staging is
not written again before every rank has entered the next redistribute's all-gather, so
a reader has finished copying out by then.
"""

from __future__ import annotations

import math
import pickle
import weakref

import torch
import torch.distributed as dist
from tensordict import TensorDict

from siirl.data_coordinator.protocol import get_non_tensor
from siirl.data_coordinator.shared_memory import Mapping, Staging, enabled, node_key, open_peer
from siirl.data_coordinator.transport import Piece

__all__ = ["FALLBACK", "WRITTEN", "SameNode", "copy_rows", "run_start", "staged_groups"]

WRITTEN, FALLBACK = 1, 2  # a note's status
ALIGN = 64  # region start alignment: any dtype may view it


def run_start(rows: list[int]) -> int | None:
    """The first row when ``rows`` (not empty) are one ascending contiguous run, else None."""
    start = rows[0]
    return start if rows == list(range(start, start + len(rows))) else None


def copy_rows(out: torch.Tensor, src: torch.Tensor, rows: list[int]) -> None:
    """``out[:] = src[rows]`` in one copy (a contiguous run is a plain copy)."""
    if not rows:
        return
    start = run_start(rows)
    if start is not None:
        out.copy_(src.narrow(0, start, len(rows)))
        return
    index = torch.tensor(rows, dtype=torch.long, device=src.device)
    if src.device == out.device and src.dtype == out.dtype:
        torch.index_select(src, 0, index, out=out)
    else:
        out.copy_(src.index_select(0, index))


def staged_groups(sender: int, pairs: dict, readers: dict[int, tuple], routes: set,
                  source_rank: int) -> list[tuple[int, list[int]]]:
    """(destination DP group, rows) that source DP rank ``sender`` writes to its staging,
    in group order: those with a reader other than the sender that reads over shared
    memory. ``readers[d]`` are the ranks of destination group d."""
    return [(d, pairs[(sender, d)]) for d in sorted(readers) if (sender, d) in pairs
            and any((source_rank, p) in routes for p in readers[d] if p != source_rank)]


def tensor_layout(schema: list[tuple], counts: list[tuple[int, int]]) -> tuple[dict, int]:
    """Offsets of each staged group's tensor fields in a staging file, and where the
    pickled values may start. ``counts``: (destination group, rows)."""
    offset, out = 0, {}
    for d, rows in counts:
        out[d] = {}
        for key, kind, dtype, trailing in schema:
            if kind == "tensor":
                shape = (rows, *trailing)
                out[d][key] = (offset, dtype, shape)
                offset += -(-math.prod(shape) * dtype.itemsize // ALIGN) * ALIGN
    return out, offset


def _region(flat: torch.Tensor, offset: int, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    nbytes = math.prod(shape) * dtype.itemsize
    return flat.narrow(0, offset, nbytes).view(dtype).view(shape)


class SameNode:
    """One DataBuffer's shared-memory state: its staging file and its peers' files."""

    def __init__(self, setting: bool | None = None):
        self.on = enabled(setting) and node_key() is not None
        self.staging: Staging | None = None
        self.peers: dict[int, Mapping] = {}  # rank -> its staging, mapped here
        self.tried: dict[int, tuple] = {}  # rank -> (identity, opened?)
        self._release = weakref.finalize(self, _close_all, self.peers, [])

    def announce(self, active: bool) -> dict:
        """This rank's part of the metadata record."""
        ident = None
        if self.on and active:
            if self.staging is None:
                self.staging = Staging()
                self._release.detach()
                self._release = weakref.finalize(self, _close_all, self.peers, [self.staging])
            ident = {"node": node_key(), "file": self.staging.identity}
        return {"shm": ident, "reach": dict(self.tried)}

    def routes(self, by_rank: dict[int, dict], members: list[int], group) -> set:
        """(sender, reader) rank pairs that use shared memory; may all-gather once (see
        the module doc), so every rank of the group calls it, with the same records."""
        ids = {r: m.get("shm") for r, m in by_rank.items()}
        pairs = [(s, r) for s in ids for r in ids if s != r and ids[s] and ids[r]
                 and ids[s]["node"] == ids[r]["node"]]
        tried = {r: m.get("reach") or {} for r, m in by_rank.items()}
        if any(tried[r].get(s, (None,))[0] != ids[s]["file"] for s, r in pairs):
            me = dist.get_rank()
            self._connect({s: ids[s]["file"] for s, r in pairs if r == me})
            gathered: list = [None] * len(members)
            dist.all_gather_object(gathered, dict(self.tried), group=group)
            tried = dict(zip(members, gathered, strict=True))
        return {(s, r) for s, r in pairs if tried[r].get(s) == (ids[s]["file"], True)}

    def _connect(self, files: dict[int, tuple]) -> None:
        for rank in [r for r in self.peers if r not in files or self.tried[r][0] != files[r]]:
            self.peers.pop(rank).close()  # that peer's file changed or is gone
        for rank, ident in files.items():
            if self.tried.get(rank, (None,))[0] != ident:
                mapping = open_peer(ident)
                if mapping is not None:
                    self.peers[rank] = mapping
                self.tried[rank] = (ident, mapping is not None)

    def stage(self, batch: TensorDict, groups: list[tuple[int, list[int]]],
              schema: list[tuple]) -> tuple[dict[int, list[int]], int]:
        """Write the rows of each (group, rows) into the staging file. Returns the note
        for the readers of each group, [status, rows, values offset, values length], and
        the bytes written."""
        if not groups:
            return {}, 0
        layout, end = tensor_layout(schema, [(d, len(rows)) for d, rows in groups])
        values = {key: get_non_tensor(batch, key) for key, kind, _, _ in schema
                  if kind != "tensor"}
        blobs = [pickle.dumps({k: [v[i] for i in rows] for k, v in values.items()},
                              protocol=pickle.HIGHEST_PROTOCOL) for _, rows in groups]
        total = end + sum(len(b) for b in blobs)
        try:
            self.staging.reserve(total)
        except OSError:  # no memory for the file: these rows take the transport
            return {d: [FALLBACK, len(rows), 0, 0] for d, rows in groups}, 0
        flat = self.staging.tensor(total)  # mapped once for all the writes below
        notes, at = {}, end
        for (d, rows), blob in zip(groups, blobs, strict=True):
            for key, where in layout[d].items():
                copy_rows(_region(flat, *where), batch.get(key), rows)
            self.staging.write(at, blob)
            notes[d] = [WRITTEN, len(rows), at, len(blob)]
            at += len(blob)
        return notes, at

    def read(self, rank: int, groups: list[tuple[int, int]], mine: int, schema: list[tuple],
             note: list[int]) -> Piece:
        """Rows for destination group ``mine`` from ``rank``'s staging, as views into it
        (``shared``: copy them before the next redistribute)."""
        layout, _ = tensor_layout(schema, groups)
        _, rows, at, length = note
        peer = self.peers[rank]
        values = pickle.loads(peer.read(at, length))
        flat = peer.tensor(at + length)
        tensors = {key: _region(flat, *where) for key, where in layout[mine].items()}
        return Piece(rows, tensors, values, shared=True)

    def close(self) -> None:
        """Release the files now (also done when the DataBuffer is collected); later
        transfers of this rank use the transport."""
        self.on = False
        self._release()
        self.staging = None
        self.tried.clear()


def _close_all(peers: dict[int, Mapping], own: list) -> None:
    for mapping in [*peers.values(), *own]:
        mapping.close()
    peers.clear()
