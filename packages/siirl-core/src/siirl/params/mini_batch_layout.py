"""How the dataloader lays each global batch out over the workers, so that N workers take
the same PPO optimizer steps on the same rows as one.

One worker cuts a step's prompts into contiguous mini-batches of ``ppo_mini_batch_size``
(``siirl.engine.common.ppo_update``, shuffle off). The loader cuts the global batch into
``loader_mini_batches`` equal consecutive chunks and gives each data-loading worker its
share of every chunk (``siirl.data_coordinator.dataloader``), so the workers' k-th local
mini-batches are together one worker's k-th. A chunk is the greatest common divisor of the
actor's and, when a critic trains, the critic's mini-batch, so the mini-batches of both
roles are whole runs of chunks. Each worker's share of a chunk must be whole prompts
(``mini_batch_share_problems``, checked in the validation pass).
"""

from __future__ import annotations

import math
from typing import Any, List, Optional

from siirl.params.key_paths import value_at

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"


def _size(config: Any, key: str) -> Optional[int]:
    value = value_at(config, key)
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return value if ok else None


def critic_trains(config: Any) -> bool:
    """``critic.enable`` where set, else whether the estimator is GAE (PPO)."""
    enable = value_at(config, "critic.enable")
    if enable is not None:
        return bool(enable)
    return str(value_at(config, "algorithm.adv_estimator")).lower() == "gae"


def _mini_batch_sizes(config: Any) -> List[tuple]:
    """(key, prompts) of the mini-batch size of each role that trains with the actor."""
    sizes = [(f"{A}.ppo_mini_batch_size", _size(config, f"{A}.ppo_mini_batch_size"))]
    if critic_trains(config):
        sizes.append(("critic.ppo_mini_batch_size",
                      _size(config, "critic.ppo_mini_batch_size")))
    return [(key, size) for key, size in sizes if size]


def loader_mini_batches(config: Any) -> int:
    """The number of chunks the loader cuts each global batch into: data.train_batch_size /
    gcd(the mini-batch sizes); 1 where the sizes do not divide the batch (the validation
    pass names that) or with dynamic sampling on (``algorithm.filter_groups.enable``: a
    generation round loads data.gen_batch_size prompts and the kept groups are cut to the
    step's batch afterwards, so no loader layout can line up with the mini-batches)."""
    batch = _size(config, "data.train_batch_size")
    sizes = [size for _, size in _mini_batch_sizes(config)]
    if not batch or not sizes or value_at(config, "algorithm.filter_groups.enable"):
        return 1
    chunk = math.gcd(*sizes)
    return batch // chunk if batch % chunk == 0 else 1


def loader_ranks(config: Any) -> Optional[int]:
    """The workers that load distinct rows: all of them over the rollout's tensor-parallel
    groups (peers of one group read the same rows)."""
    nodes, per_node = _size(config, "trainer.nnodes"), _size(config, "trainer.n_gpus_per_node")
    tp = _size(config, f"{R}.tensor_model_parallel_size") or 1
    if not nodes or not per_node or (nodes * per_node) % tp:
        return None
    return nodes * per_node // tp


def mini_batch_share_problems(config: Any) -> List[str]:
    """A refusal where a worker's share of a loader chunk would not be whole prompts."""
    chunks, ranks = loader_mini_batches(config), loader_ranks(config)
    if chunks == 1 or not ranks or ranks == 1:
        return []  # one chunk: data.train_batch_size splits over the workers (checked apart)
    chunk = _size(config, "data.train_batch_size") // chunks
    if chunk % ranks == 0:
        return []
    sizes = _mini_batch_sizes(config)
    named = " and ".join(f"{key}={size}" for key, size in sizes)
    runs = f" cut each step into runs of {chunk} prompts (their gcd), which" \
        if len({size for _, size in sizes}) > 1 else ""
    how = f"{ranks} = trainer.nnodes x trainer.n_gpus_per_node"
    if (_size(config, f"{R}.tensor_model_parallel_size") or 1) > 1:
        how += f" / {R}.tensor_model_parallel_size"
    return [f"{named}{runs} {'do' if runs or len(sizes) > 1 else 'does'} not split evenly "
            f"over the {ranks} workers that load prompts ({how}): each worker loads an "
            f"equal share of every PPO mini-batch, so that N workers train each optimizer "
            f"step on the same rows as one worker; use a mini-batch size that is a multiple "
            f"of {ranks}"]
