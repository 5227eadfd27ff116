"""How many workers the job has: the number the planner splits the DAG over.

Starting them (in this process, or as Ray actors) needs the DAGWorker, which sits above
this layer, so it lives in ``siirl.launch`` (``siirl.launch.job.start_workers``).
"""

from __future__ import annotations

from siirl.errors import ConfigError
from siirl.params import SiiRLArguments


def training_workers(config: SiiRLArguments) -> int:
    """The workers that run the training graph (all of them unless asynchronous)."""
    nodes, per_node = config.trainer.nnodes, config.trainer.n_gpus_per_node
    if nodes < 1 or per_node < 1:
        raise ConfigError(f"trainer.nnodes={nodes} and trainer.n_gpus_per_node={per_node} "
                          "must both be at least 1")
    return nodes * per_node


def num_workers(config: SiiRLArguments) -> int:
    """Every worker of the job: with ``async_training.enable`` the rollout workers
    (``rollout.nnodes * rollout.n_gpus_per_node``) come after the trainers."""
    workers = training_workers(config)
    if config.async_training.enable:
        workers += config.rollout.nnodes * config.rollout.n_gpus_per_node
    return workers
