"""One training job: load the pipeline, plan it over the workers, start them.

One worker runs in this process (the embedded default: no Ray, no torch.distributed).
More than one (``trainer.nnodes * trainer.n_gpus_per_node``) run as Ray actors, one per
device (see ``ray_launcher``); ``trainer.device=cpu`` makes them CPU processes.
"""

from __future__ import annotations

from typing import Any, List, Optional

from siirl.execution.scheduler.task_scheduler import WorkerAssignment
from siirl.params import SiiRLArguments


def run(config: Any, print_dag: bool = False) -> Optional[list]:
    """Run the job (or only print its workflow and per-worker plan); rank 0's metric history.
    ``config`` (the composed DictConfig, or a dict) is typed here, once: everything the
    job starts reads that ``SiiRLArguments``."""
    from siirl.dag_worker.checkpoint.storage import check_output_dir
    from siirl.execution.dag import async_split
    from siirl.execution.dag.async_split import is_async
    from siirl.execution.dag.planner import plan_graph
    from siirl.execution.dag.task_loader import load_pipeline
    from siirl.execution.scheduler.launch import num_workers, training_workers
    from siirl.execution.scheduler.task_scheduler import TaskScheduler, format_plan
    from siirl.launch.inputs import check_inputs
    from siirl.params.typed import to_typed

    config = to_typed(config)

    if not print_dag:
        check_inputs(config)  # a missing dataset or model stops the job before anything loads
        if config.trainer.nnodes == 1:  # elsewhere: the workers' folder
            check_output_dir(config.trainer.default_local_dir)
    # the planner decides what of the workflow runs (what --print-dag shows is what runs)
    graph = plan_graph(load_pipeline(config), config, training_workers(config))
    stream: List[str] = []
    if is_async(config):  # the rollout and training sub-graphs on workers of their own
        plan, stream = async_split.assignments(graph, config)
    else:
        plan = TaskScheduler(num_workers(config)).schedule(graph)
    if print_dag:
        print(graph.format())
        print(format_plan(plan))
        for line in stream:
            print(line)
        return None
    return start_workers(config, plan)


def start_workers(config: SiiRLArguments, plan: List[WorkerAssignment]) -> list:
    if len(plan) > 1:  # the driver of Ray workers never imports torch (seconds)
        from siirl.launch.ray_launcher import launch_ray

        return launch_ray(config, plan)
    from siirl.dag_worker.dagworker import DAGWorker
    from siirl.dag_worker.walk.trainer_loop import Trainer

    worker = DAGWorker(plan[0].graph, config, rank=0, world_size=1)
    return Trainer(worker).fit()  # setup() resolves every plugin before any step
