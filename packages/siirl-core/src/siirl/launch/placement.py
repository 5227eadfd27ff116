"""Where the workers of a job go on the Ray cluster: one placement group per node of each
worker pool, one bundle per worker.

A synchronous job has one pool, ``trainer.nnodes`` nodes of ``trainer.n_gpus_per_node``
workers. An asynchronous one (``async_training.enable``) has two, in rank order: the
trainers' and the rollout workers' (``rollout.nnodes`` x ``rollout.n_gpus_per_node``). A
pool on several nodes asks for that many distinct nodes; two pools may share a node that
has room for both (as verl's resource pools do), so one machine runs the smallest layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from siirl.errors import ConfigError
from siirl.params import SiiRLArguments

PLACEMENT_TIMEOUT_S = 120


@dataclass(frozen=True)
class Pool:
    name: str  # its config section: trainer, rollout
    nodes: int
    per_node: int


def worker_pools(config: SiiRLArguments, num_workers: int) -> List[Pool]:
    """The job's pools, in rank order."""
    trainer = config.trainer
    if not config.async_training.enable:
        return [Pool("trainer", trainer.nnodes, num_workers // trainer.nnodes)]
    rollout = config.rollout
    return [Pool("trainer", trainer.nnodes, trainer.n_gpus_per_node),
            Pool("rollout", rollout.nnodes, rollout.n_gpus_per_node)]


def bundle_of(rank: int, pools: List[Pool]) -> Tuple[int, int]:
    """(placement group, bundle) of worker ``rank``: the groups go pool by pool, node by
    node."""
    group = 0
    for pool in pools:
        if rank < pool.nodes * pool.per_node:
            return group + rank // pool.per_node, rank % pool.per_node
        rank -= pool.nodes * pool.per_node
        group += pool.nodes
    raise ValueError(f"rank {rank} is beyond the workers of {pools}")


def describe_nodes() -> str:
    import ray

    return "; ".join(f"{n['NodeManagerAddress']} {n['NodeID'][:8]}: "
                     f"{ {k: v for k, v in n.get('Resources', {}).items() if k in ('CPU', 'GPU')} }"
                     for n in ray.nodes() if n.get("Alive"))


def _fits(node: dict, bundle: dict, count: int) -> bool:
    return node.get("Alive") and all(node.get("Resources", {}).get(k, 0) >= v * count
                                     for k, v in bundle.items())


def _target_nodes(pool: Pool, bundle: dict) -> List[str]:
    """Distinct alive nodes with room for a node of ``pool``, the driver's own first."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    fitting = sorted((n["NodeID"] for n in ray.nodes() if _fits(n, bundle, pool.per_node)),
                     key=lambda node_id: node_id != here)
    if len(fitting) < pool.nodes:
        raise ConfigError(
            f"{pool.name}.nnodes={pool.nodes}: the Ray cluster has {len(fitting)} node(s) with "
            f"room for {pool.per_node} worker(s) of {bundle} each ({describe_nodes()}); lower "
            f"{pool.name}.nnodes or {pool.name}.n_gpus_per_node, or add nodes")
    return fitting[:pool.nodes]


def _pool_groups(pool: Pool, bundle: dict, on_gpu: bool) -> list:
    from ray.util.placement_group import placement_group

    if pool.nodes == 1:
        return [placement_group([dict(bundle)] * pool.per_node,
                                strategy="STRICT_PACK" if on_gpu else "PACK")]
    return [placement_group([dict(bundle)] * pool.per_node, strategy="STRICT_PACK",
                            _soft_target_node_id=node_id)
            for node_id in _target_nodes(pool, bundle)]


def _remove(groups: list) -> None:
    import ray

    for group in groups:
        ray.util.remove_placement_group(group)


def placement_groups(pools: List[Pool], on_gpu: bool) -> list:
    """The ready placement groups of ``pools``, pool by pool, node by node."""
    import ray
    from ray.util.placement_group import placement_group_table

    bundle = {"CPU": 1, "GPU": 1} if on_gpu else {"CPU": 1}
    groups: list = []
    spans = []  # (pool, its groups)
    try:
        for pool in pools:
            made = _pool_groups(pool, bundle, on_gpu)
            groups += made
            spans.append((pool, made))
    except ConfigError:
        _remove(groups)
        raise
    ready = [g.ready() for g in groups]
    done, _ = ray.wait(ready, num_returns=len(ready), timeout=PLACEMENT_TIMEOUT_S)
    if len(done) < len(ready):
        _remove(groups)
        layout = " + ".join(f"{p.nodes} node(s) x {p.per_node} worker(s)" for p in pools)
        names = " and ".join(f"{p.name}.nnodes/n_gpus_per_node" for p in pools)
        raise ConfigError(
            f"the Ray cluster cannot place {layout} of {bundle} within {PLACEMENT_TIMEOUT_S}s "
            f"(available: {ray.available_resources()}); lower {names} or add nodes")
    for pool, made in spans:  # the target is a hint: a group on an occupied node breaks it
        if pool.nodes == 1:
            continue
        placed = [set(placement_group_table(g)["bundles_to_node_id"].values()) for g in made]
        if len(set().union(*placed)) < pool.nodes:
            _remove(groups)
            raise ConfigError(
                f"{pool.name}.nnodes={pool.nodes}: the workers could not be spread over "
                f"{pool.nodes} distinct nodes ({describe_nodes()}); free the nodes or lower "
                f"{pool.name}.nnodes")
    return groups
