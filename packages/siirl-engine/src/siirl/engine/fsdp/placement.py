"""Where an FSDP engine's rank stands: which ranks hold other rows (data parallel), which
hold other shards of the module, and with Ulysses which split its sequences.

Without sequence parallelism both are the role's group. With
``ulysses_sequence_parallel_size`` s, s consecutive ranks read the same rows (the DAG
layout gives them the same share, ``siirl.dag_worker.walk.layouts``): batch arithmetic, loss
normalisers and metrics count the world/s data-parallel ranks, while FSDP2 still shards
the module over every rank of the role, as verl does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import torch

from siirl.engine.common.runtime import data_parallel_world, process_group
from siirl.engine.fsdp import ulysses
from siirl.engine.fsdp.ulysses import SequenceParallel
from siirl.errors import ConfigError

__all__ = ["Placement", "placement"]


@dataclasses.dataclass(frozen=True)
class Placement:
    dp_rank: int
    dp_size: int
    dp_group: Any  # ranks holding other rows (None: the default group)
    shard_rank: int
    shard_group: Any  # ranks the module is sharded or replicated over
    sequence_parallel: Optional[SequenceParallel] = None

    def backend_kwargs(self) -> Dict[str, Any]:
        """The rank arguments of ``FSDPBackend``."""
        return dict(dp_rank=self.dp_rank, dp_size=self.dp_size, dp_group=self.dp_group,
                    shard=(self.shard_rank, self.shard_group))


# groups made over the default group when no worker made them (tests, a custom launcher)
_WORLD_GROUPS: Dict[Tuple[int, int], Tuple[Any, Any]] = {}


def _sequence_groups(worker: Any, group: Any, size: int, world: int, key: str
                     ) -> Tuple[Any, Any]:
    lookup = getattr(worker, "sequence_parallel_groups", None)
    groups = lookup(size) if callable(lookup) else None
    if groups is not None:
        return groups
    if group is not None:  # a sub-group: only its maker knows every rank's plan
        raise ConfigError(f"{key}={size}: the workers made no sequence-parallel groups of "
                          f"this size; they are made at start-up from the run's top-level "
                          f"settings (a size set for one agent group only is not supported).")
    from siirl.execution.scheduler.process_group_manager import sequence_groups

    dist = torch.distributed
    key = (id(dist.group.WORLD), size)
    if key not in _WORLD_GROUPS:  # collective: every rank builds its engines alike
        _WORLD_GROUPS[key] = sequence_groups([range(world)], size, dist.get_rank(),
                                             dist.get_backend())
    return _WORLD_GROUPS[key]


def placement(worker: Any, role: str, size: Any, key: str, remove_padding: bool = True,
              remove_padding_key: str = "actor_rollout_ref.model.use_remove_padding"
              ) -> Placement:
    """The placement of ``role``'s engine on this rank for a Ulysses ``size`` (``key``)."""
    group = process_group(worker, role)
    rank, world = data_parallel_world(worker)
    size = int(size or 1)
    if size == 1:
        return Placement(rank, world, group, rank, group)
    if size < 1 or world % size:  # siirl-train refuses these before loading; engines
        # built without it (tests, scripts) meet them here
        raise ConfigError(f"{key}={size} must divide the number of workers running the "
                          f"{role} ({world}): each group of {size} consecutive workers "
                          f"splits the same sequences.")
    if not remove_padding:
        raise ConfigError(f"{key}={size} splits packed rows: set {remove_padding_key}=true "
                          f"(verl requires it as well).")
    sp_group, dp_group = _sequence_groups(worker, group, size, world, key)
    ulysses.install()
    sp = SequenceParallel(sp_group, size, torch.distributed.get_rank(sp_group))
    return Placement(rank // size, world // size, dp_group, rank, group, sp)
