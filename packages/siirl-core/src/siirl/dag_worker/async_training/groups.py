"""The process groups of an asynchronous run, made by every worker in the same order
(``new_group`` is collective over the world): one gloo group per (rollout worker, trainer
worker) pair for the row stream, and the weight channel's groups over trainer rank 0 and
the rollout workers."""

from __future__ import annotations

import datetime
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional

import torch

from siirl.dag_worker.async_training.wire import WeightGroups


@dataclass
class AsyncGroups:
    rank: int
    trainers: List[int]
    rollouts: List[int]
    pairs: Dict[tuple, Any] = field(default_factory=dict)  # (rollout, trainer) -> group
    weights: Optional[WeightGroups] = None  # None on trainers other than the first

    @property
    def is_trainer(self) -> bool:
        return self.rank in self.trainers


def build_groups(rank: int, trainers: List[int], rollouts: List[int], backend: str,
                 timeout_s: float, device: torch.device) -> AsyncGroups:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=float(timeout_s))
    groups = AsyncGroups(rank, list(trainers), list(rollouts))
    for r in rollouts:
        for t in trainers:
            group = dist.new_group([t, r], backend="gloo", timeout=timeout)
            if rank in (t, r):
                groups.pairs[(r, t)] = group
    members = [trainers[0], *rollouts]
    meta = dist.new_group(members, backend="gloo", timeout=timeout)
    data = dist.new_group(members, backend=backend, timeout=timeout) \
        if backend != "gloo" else meta
    if rank in members:
        groups.weights = WeightGroups(trainers[0], meta, data, device)
    return groups


@contextmanager
def own_world(group: Any) -> Iterator[None]:
    """Within: ``group`` (a side's workers, ranks 0..T-1 for the trainers) is this worker's
    default process group. Training backends take the default group for their world
    (megatron-core lays its parallel groups over it and gathers its optimizer's parameter
    groups over it), and the other side's workers must take no part in that. The channels
    between the two sides name their groups, so they are untouched."""
    import torch.distributed as dist

    from siirl.execution.scheduler.process_group_manager import as_default_group

    if group is None or dist.get_world_size(group) == dist.get_world_size():
        yield
        return
    if dist.get_rank(group) != dist.get_rank():  # ranks keep their numbers in either world
        raise ValueError(f"rank {dist.get_rank()} is rank {dist.get_rank(group)} of its side: "
                         "a side made its own world must hold ranks 0..T-1")
    with as_default_group(group):
        yield
