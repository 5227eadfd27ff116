"""The two channels between rollout and trainer workers (torch.distributed).

* Rows: point to point, one gloo group per (rollout worker, trainer worker) pair, so each
  pair's sender and receiver threads have a communicator of their own. A message is an
  int64 header (kind, payload bytes) and the pickled payload as uint8.
* Weights: a broadcast from trainer rank 0 to the rollout workers, bucket by bucket
  (``rollout.update_weights_bucket_megabytes``): each bucket's names, shapes and dtypes go
  as a small object over a gloo group, its tensors as one flat byte tensor over the data
  group (NCCL on GPU, the same gloo group on CPU). A closing object carries the sync's
  version and its notes (acknowledged prompts, whether to validate or stop).
"""

from __future__ import annotations

import pickle
from typing import Any, Iterable, List, Optional, Tuple

import torch
import torch.distributed as dist

ROWS, VALIDATION, END = 1, 2, 3


def send_message(kind: int, payload: Any, dst: int, group: Any) -> int:
    """Send one message to global rank ``dst``; the bytes sent."""
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL) if payload is not None \
        else b""
    dist.send(torch.tensor([kind, len(data)], dtype=torch.int64), dst, group=group)
    if data:
        dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst, group=group)
    return len(data)


def recv_message(src: int, group: Any) -> Tuple[int, Any]:
    header = torch.empty(2, dtype=torch.int64)
    dist.recv(header, src, group=group)
    kind, size = int(header[0]), int(header[1])
    if not size:
        return kind, None
    data = torch.empty(size, dtype=torch.uint8)
    dist.recv(data, src, group=group)
    return kind, pickle.loads(data.numpy().tobytes())


class WeightGroups:
    """The weight channel: ``meta`` (gloo) and ``data`` (the device's backend) groups over
    trainer rank 0 (``src``) and every rollout worker."""

    def __init__(self, src: int, meta: Any, data: Any, device: torch.device):
        self.src, self.meta, self.data, self.device = src, meta, data, device

    def _object(self, obj: Any = None) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=self.src, group=self.meta)
        return box[0]

    def send(self, buckets: Optional[Iterable[List[Tuple[str, torch.Tensor]]]],
             notes: dict) -> int:
        """Broadcast ``buckets`` (None: other trainer ranks join the export only) then
        ``notes``; the bytes sent."""
        sent = 0
        for bucket in buckets or ():
            self._object(("bucket", [(name, tuple(t.shape), t.dtype) for name, t in bucket]))
            flat = torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8)
                              for _, t in bucket]).to(self.device)
            dist.broadcast(flat, src=self.src, group=self.data)
            sent += flat.numel()
        self._object(("end", notes))
        return sent

    def receive(self) -> Tuple[dict, List[List[Tuple[str, torch.Tensor]]]]:
        """One sync: (notes, buckets of named tensors on this worker's device)."""
        buckets = []
        while True:
            kind, body = self._object()
            if kind == "end":
                return body, buckets
            sizes = [int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
                     for _, shape, dtype in body]
            flat = torch.empty(sum(sizes), dtype=torch.uint8, device=self.device)
            dist.broadcast(flat, src=self.src, group=self.data)
            bucket = []
            for (name, shape, dtype), part in zip(body, flat.split(sizes), strict=True):
                # a copy of its own: a view would need its offset aligned to the dtype
                bucket.append((name, part.clone().view(dtype).reshape(shape)))
            buckets.append(bucket)
