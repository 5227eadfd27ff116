"""Sums over the whole batch when its rows are spread over workers.

A statistic over the batch (advantage whitening, GPG's alpha, CPGD's group count, the
advantage metrics) must come from every worker's rows, or N workers would not train like
one. The pieces that compute one take a ``reduction``: :data:`LOCAL` (the default) adds
up this process's rows only, which is the whole batch when one process holds it (one
worker, or a test calling an estimator with tensors); the advantage node passes a
:class:`WorkerReduction` over the workers that share the batch. Sums are float64.
"""

from __future__ import annotations

import math
from typing import Any, List, Sequence

import torch


class BatchReduction:
    """This process holds the whole batch: sums are its own."""

    active = False

    def sum(self, values: Sequence[Any]) -> torch.Tensor:
        """``values`` (numbers or 0-d tensors) summed over all workers, as a float64
        vector of the same length."""
        return torch.tensor([float(v) for v in values], dtype=torch.float64)

    def gather(self, obj: Any) -> List[Any]:
        """Every contributing worker's ``obj``, in rank order."""
        return [obj]


LOCAL = BatchReduction()


class WorkerReduction(BatchReduction):
    """Sums over the workers of ``comm`` (a ``collective.WorkerComm`` spanning the workers
    that share the batch). A worker whose rows copy a peer's (a tensor-parallel peer)
    passes ``contributes=False``: it takes part in every collective and adds nothing."""

    def __init__(self, comm: Any, contributes: bool = True):
        self.comm, self.contributes = comm, bool(contributes)

    @property
    def active(self) -> bool:
        return bool(self.comm.active)

    def sum(self, values: Sequence[Any]) -> torch.Tensor:
        mine = [float(v) if self.contributes else 0.0 for v in values]
        parts = self.comm.all_gather(mine)
        return torch.tensor([math.fsum(column) for column in zip(*parts, strict=True)],
                            dtype=torch.float64)

    def gather(self, obj: Any) -> List[Any]:
        parts = self.comm.all_gather((self.contributes, obj))
        return [part for contributes, part in parts if contributes]


def reduction_for(worker: Any, node: Any = None) -> BatchReduction:
    """The reduction over the rows of every worker running ``worker``'s graph (:data:`LOCAL`
    when it runs alone); a worker holding a tensor-parallel peer's copy of the rows at
    ``node`` adds nothing. Nodes outside core (the embodied reward manager, the agentic
    rollout) build theirs here too."""
    from siirl.dag_worker.walk.collective import WorkerComm

    groups = getattr(worker, "process_groups", None)
    if groups is not None:
        comm = WorkerComm(groups.group_rank, groups.group_size, groups.control_group)
    else:
        comm = getattr(worker, "comm", None)
    if comm is None or not comm.active:
        return LOCAL
    holds = getattr(worker, "holds_rows_of", None)
    contributes = holds(node.node_id) if node is not None and holds is not None else True
    return WorkerReduction(comm, contributes)
