"""Control-plane collectives among all workers: metrics, validation rows, barriers.

Small Python objects only (metric dicts, per-row scores, a checkpoint path), never batches:
those move through the DataBuffer. With one worker every call is a local no-op, so the
training loop reads the same on 1 and N workers.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from siirl.execution.metric_worker.aggregation import reduce_metrics


class WorkerComm:
    def __init__(self, rank: int = 0, world_size: int = 1, group: Any = None):
        self.rank, self.world_size, self.group = int(rank), int(world_size), group

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_chief(self) -> bool:
        """Rank 0 logs, writes shared files and commits checkpoints."""
        return self.rank == 0

    def all_gather(self, obj: Any) -> List[Any]:
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.active:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as dist

            dist.barrier(group=self.group)

    def reduce_metrics(self, metrics: Dict[str, float],
                       weight: Optional[float] = None) -> Dict[str, float]:
        """One value per metric over all workers (mean/max/min/sum by metric name)."""
        if not self.active:
            return metrics
        gathered = self.all_gather((metrics, weight))
        weights = None if any(w is None for _, w in gathered) else [w for _, w in gathered]
        return reduce_metrics([m for m, _ in gathered], weights)
