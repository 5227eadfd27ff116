"""A worker process of an asynchronous run: its groups, its DAGWorker, its loop."""

from __future__ import annotations

import copy
from typing import Any, Optional

import torch

from siirl.dag_worker.async_training.groups import build_groups, own_world
from siirl.dag_worker.async_training.shape import AsyncShape

ACTOR_STRATEGY = "actor_rollout_ref.actor.strategy"
# the backend a rollout worker holds its copy of the policy in: it only generates
ROLLOUT_COPY_STRATEGY = "fsdp"


def rollout_side_config(config: Any, rollouts: int) -> Any:
    """A rollout worker's settings: its copy of the policy (the hf rollout generates with
    it; the syncs overwrite it) lives in the fsdp backend whatever the trainers train on
    (the weights arrive HF-named and whole), and whole on each rollout worker
    (``fsdp_size=1``, no offload), so that the rollout workers generate independently:
    a sharded copy would make each forward a collective over them."""
    from siirl.params.key_paths import value_at

    actor = "actor_rollout_ref.actor"
    whole = rollouts == 1 or (int(value_at(config, f"{actor}.fsdp_config.fsdp_size")) == 1
                              and not value_at(config, f"{actor}.fsdp_config.param_offload"))
    if str(value_at(config, ACTOR_STRATEGY)) == ROLLOUT_COPY_STRATEGY and whole:
        return config
    config = copy.deepcopy(config)
    config.actor_rollout_ref.actor.strategy = ROLLOUT_COPY_STRATEGY
    config.actor_rollout_ref.ref.strategy = ROLLOUT_COPY_STRATEGY
    if not whole:
        fsdp = config.actor_rollout_ref.actor.fsdp_config
        fsdp.fsdp_size, fsdp.param_offload, fsdp.optimizer_offload = 1, False, False
    return config


def run_worker(rank: int, graph: Any, config: Any, process_groups: Any, backend: str,
               started_at: Optional[float], built: dict) -> Optional[list]:
    """Train (trainer ranks) or generate (rollout ranks) to the end; trainer rank 0
    returns the metric history."""
    from siirl.dag_worker.async_training.rollout_side import AsyncRollout
    from siirl.dag_worker.async_training.trainer_side import AsyncTrainer
    from siirl.dag_worker.dagworker import DAGWorker
    from siirl.dag_worker.walk.collective import WorkerComm
    from siirl.dag_worker.walk.trainer_loop import configure_threads, seed_everything

    shape = AsyncShape.of(config)
    trainers = list(range(shape.trainers))
    rollouts = list(range(shape.trainers, shape.trainers + shape.rollouts))
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
        else torch.device("cpu")
    groups = build_groups(rank, trainers, rollouts, backend,
                          float(config.trainer.dist_timeout_s), device)
    if not groups.is_trainer:
        config = rollout_side_config(config, shape.rollouts)
    # collectives of a side stay within its own workers
    comm = WorkerComm(rank, process_groups.group_size, process_groups.control_group)
    worker = DAGWorker(graph, config, rank=process_groups.group_rank,
                       world_size=process_groups.group_size, comm=comm,
                       process_groups=process_groups)
    built["worker"] = worker
    if groups.is_trainer:
        with own_world(process_groups.data_group):
            return AsyncTrainer(worker, groups, shape, started_at=started_at).fit()
    configure_threads(config)
    seed_everything(config.trainer.seed)
    AsyncRollout(worker, groups, shape).run()
    return None
