"""Start the planned workers and run training.

One worker runs in this process (the embedded default: no Ray). Running N workers as Ray
actors comes with multi-worker execution; until then asking for more than one worker is a
clear configuration error rather than a silent single-worker run.
"""

from __future__ import annotations

from typing import Any, List

from siirl.errors import ConfigError
from siirl.execution.config_select import select
from siirl.execution.scheduler.task_scheduler import WorkerAssignment


def num_workers(config: Any) -> int:
    nodes = int(select(config, "trainer.nnodes", 1))
    return nodes * int(select(config, "trainer.n_gpus_per_node", 1))


def launch(config: Any, plan: List[WorkerAssignment]) -> list:
    from siirl.dag_worker.dagworker import DAGWorker
    from siirl.dag_worker.trainer_loop import Trainer

    if len(plan) != 1:
        raise ConfigError(
            f"{len(plan)} workers requested (trainer.nnodes * trainer.n_gpus_per_node) but this "
            "release runs one worker per job; set trainer.nnodes=1 trainer.n_gpus_per_node=1")
    worker = DAGWorker(plan[0].graph, config, rank=0, world_size=1)
    return Trainer(worker).fit()  # setup() resolves every plugin before any step
