"""Point-to-point transport of batch pieces for the DataBuffer (torch.distributed).

A message from one rank to another carries the rows of one sub-batch as

1. an int64 length (1 element): the size of the pickled header;
2. the header, a uint8 tensor: row count, tensor field names, dtypes and shapes, and the
   per-row python values of the non-tensor fields (strings, dicts: small);
3. every tensor field with bytes, raw and contiguous, viewed as uint8.

Each step is one ``batch_isend_irecv`` over all the pairs this rank talks to, then a wait:
the receiver needs the length to size the header and the header to size the tensors.
Batching is what keeps NCCL from deadlocking when two ranks send to each other (their
sends and receives form one NCCL group); for gloo it is plain isend/irecv. Viewing every
tensor as bytes makes any dtype (bool, bfloat16, ...) travel the same way on both.
``signal`` is the one-round variant for a few integers per peer (the shared-memory
route's notes).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from siirl.errors import DataError

__all__ = ["Piece", "Traffic", "exchange", "signal", "transport_device"]


@dataclass
class Piece:
    """Rows of one message: tensor fields (first dim ``rows``) and per-row python values.
    ``shared``: the tensors are views into a staging file that will be written again."""

    rows: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    values: dict[str, list] = field(default_factory=dict)
    shared: bool = False


@dataclass
class Traffic:
    """Cumulative counters. ``bytes_*``: what crossed the transport (lengths, headers and
    shared-memory notes included, the metadata all-gather not). ``rows_sent`` counts a
    row once per receiving rank, whatever the route; ``shared_rows`` of them went through
    shared memory, and ``shared_bytes`` were written to this rank's staging for that.
    ``meta_bytes``: this rank's metadata records (pickled), what the all-gather carries."""

    bytes_sent: int = 0
    bytes_received: int = 0
    rows_sent: int = 0
    shared_rows: int = 0
    shared_bytes: int = 0
    meta_bytes: int = 0


_SIGNAL_TAG = 1 << 20  # apart from exchange's tags (0, 1, ... per tensor)


def transport_device(group=None) -> torch.device:
    """cuda for an NCCL group (NCCL moves only GPU memory), else cpu (gloo send/recv)."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _raw(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor.to(device).contiguous().reshape(-1).view(torch.uint8)


def _run(ops: list, timeout: timedelta | None) -> None:
    if not ops:  # batch_isend_irecv rejects an empty list
        return
    for work in dist.batch_isend_irecv(ops):
        # Without a timeout, wait() uses the group's own (init_process_group's) timeout.
        if timeout is None:
            work.wait()
        else:
            work.wait(timeout)


def signal(
    sends: dict[int, list[int]],
    recv_from: list[int],
    *,
    width: int,
    group=None,
    timeout: timedelta | None = None,
    traffic: Traffic | None = None,
) -> dict[int, list[int]]:
    """Send ``width`` int64 to each peer of ``sends`` and receive as many from each of
    ``recv_from``, in one round (cpu tensors: only for a gloo group)."""
    out = {p: torch.tensor(v, dtype=torch.int64) for p, v in sends.items()}
    got = {p: torch.empty(width, dtype=torch.int64) for p in recv_from}
    ops = [dist.P2POp(dist.isend, t, p, group, _SIGNAL_TAG) for p, t in out.items()]
    ops += [dist.P2POp(dist.irecv, t, p, group, _SIGNAL_TAG) for p, t in got.items()]
    _run(ops, timeout)
    if traffic is not None:
        traffic.bytes_sent += 8 * width * len(out)
        traffic.bytes_received += 8 * width * len(got)
    return {p: t.tolist() for p, t in got.items()}


def exchange(
    sends: dict[int, Piece],
    recv_from: list[int],
    *,
    group=None,
    device: torch.device | None = None,
    timeout: timedelta | None = None,
    traffic: Traffic | None = None,
) -> dict[int, Piece]:
    """Send ``sends[peer]`` to each peer and receive one piece from each of ``recv_from``.

    Peers are global ranks. Every peer must call ``exchange`` with the mirror image (it
    receives from us iff we send to it). Received tensors live on ``device``.
    """
    device = device or transport_device(group)
    traffic = traffic if traffic is not None else Traffic()
    headers, out_lens, in_lens = {}, {}, {}
    for peer, piece in sends.items():
        meta = {
            "rows": piece.rows,
            "tensors": [(k, t.dtype, tuple(t.shape)) for k, t in piece.tensors.items()],
            "values": piece.values,
        }
        blob = pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)
        headers[peer] = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device)
        out_lens[peer] = torch.tensor([len(blob)], dtype=torch.int64, device=device)
    for peer in recv_from:
        in_lens[peer] = torch.empty(1, dtype=torch.int64, device=device)

    def p2p(outgoing: dict, incoming: dict) -> list:
        ops = []
        for peer, tensors in outgoing.items():
            for tag, tensor in enumerate(tensors):
                ops.append(dist.P2POp(dist.isend, tensor, peer, group, tag))
                traffic.bytes_sent += tensor.numel() * tensor.element_size()
        for peer, tensors in incoming.items():
            for tag, tensor in enumerate(tensors):
                ops.append(dist.P2POp(dist.irecv, tensor, peer, group, tag))
                traffic.bytes_received += tensor.numel() * tensor.element_size()
        return ops

    _run(p2p({p: [t] for p, t in out_lens.items()}, {p: [t] for p, t in in_lens.items()}),
         timeout)
    in_headers = {p: torch.empty(int(n.item()), dtype=torch.uint8, device=device)
                  for p, n in in_lens.items()}
    _run(p2p({p: [t] for p, t in headers.items()}, {p: [t] for p, t in in_headers.items()}),
         timeout)
    metas = {p: pickle.loads(h.cpu().numpy().tobytes()) for p, h in in_headers.items()}

    # Zero-byte fields (no rows, or a 0-wide dim) are rebuilt from the header alone. TP
    # peers share one Piece, so it is moved to the device (and made contiguous) once.
    raws: dict[int, list[torch.Tensor]] = {}
    for piece in sends.values():
        if id(piece) not in raws:
            raws[id(piece)] = [r for r in (_raw(t, device) for t in piece.tensors.values())
                               if r.numel()]
    outgoing = {p: raws[id(piece)] for p, piece in sends.items()}
    buffers: dict[int, dict[str, torch.Tensor]] = {}
    incoming = {}
    for peer, meta in metas.items():
        buffers[peer] = {}
        for key, dtype, shape in meta["tensors"]:
            nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            buffers[peer][key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
        incoming[peer] = [b for b in buffers[peer].values() if b.numel()]
    _run(p2p(outgoing, incoming), timeout)
    traffic.rows_sent += sum(piece.rows for piece in sends.values())

    received = {}
    for peer, meta in metas.items():
        tensors = {key: buffers[peer][key].view(dtype).reshape(shape)
                   for key, dtype, shape in meta["tensors"]}
        for key, values in meta["values"].items():
            if len(values) != meta["rows"]:
                raise DataError(f"rank {peer} sent {len(values)} values of {key!r} "
                                f"for {meta['rows']} rows")
        received[peer] = Piece(meta["rows"], tensors, meta["values"])
    return received
