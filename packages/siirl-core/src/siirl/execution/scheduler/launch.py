"""Start the planned workers and run training.

One worker runs in this process (the embedded default: no Ray, no torch.distributed).
More than one (``trainer.nnodes * trainer.n_gpus_per_node``) run as Ray actors, one per
device (see ``ray_launcher``); ``trainer.device=cpu`` makes them CPU processes.
"""

from __future__ import annotations

from typing import Any, List

from siirl.errors import ConfigError
from siirl.execution.config_select import select
from siirl.execution.scheduler.task_scheduler import WorkerAssignment


def num_workers(config: Any) -> int:
    nodes = int(select(config, "trainer.nnodes", 1))
    per_node = int(select(config, "trainer.n_gpus_per_node", 1))
    if nodes < 1 or per_node < 1:
        raise ConfigError(f"trainer.nnodes={nodes} and trainer.n_gpus_per_node={per_node} "
                          "must both be at least 1")
    return nodes * per_node


def launch(config: Any, plan: List[WorkerAssignment]) -> list:
    from siirl.dag_worker.dagworker import DAGWorker
    from siirl.dag_worker.trainer_loop import Trainer

    if len(plan) > 1:
        from siirl.execution.scheduler.ray_launcher import launch_ray

        return launch_ray(config, plan)
    worker = DAGWorker(plan[0].graph, config, rank=0, world_size=1)
    return Trainer(worker).fit()  # setup() resolves every plugin before any step
