"""What runs inside one worker process of a multi-worker job (a Ray actor).

The driver only hands out the plan and the rendezvous address; the worker then joins
torch.distributed, builds its process groups, its DAGWorker (engines, dataloader slice)
and runs the same training loop as a single worker. Batches never leave the workers.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence

from siirl.dag_worker.walk import startup
from siirl.params import SiiRLArguments


class WorkerProcess:
    """One DAGWorker process; ``rank`` is its global rank in the job."""

    def __init__(self, rank: int, world_size: int, config: SiiRLArguments):
        startup.relax()  # this process is ours: its imports come next (see startup)
        # set here, not as a Ray runtime_env: an actor with its own runtime_env cannot
        # take one of the worker processes Ray has already started, and waits for a new one
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.rank, self.world_size, self.config = rank, world_size, config

    def address(self) -> dict:
        """Where this process runs (its node's address as the cluster knows it, the node's
        id, the host name), and a free port on its host for the rendezvous."""
        import socket

        import ray

        from siirl.execution.scheduler.process_group_manager import (
            free_port,
            node_ip,
            pin_gloo_interface,
        )

        ip, node_id = node_ip(), ray.get_runtime_context().get_node_id()
        # the DataBuffer's shared-memory route stays within one Ray node (siirl-data reads
        # it: it does not import Ray), even where two nodes share a machine
        os.environ["SIIRL_NODE_ID"] = node_id
        pin_gloo_interface(ip)
        return {"rank": self.rank, "pid": os.getpid(), "node_ip": ip, "node_id": node_id,
                "host": socket.gethostname(), "port": free_port()}

    def run(self, master_addr: str, master_port: int, graph: Any,
            group_ranks: Sequence[Sequence[int]],
            started_at: Optional[float] = None, monitor: Any = None) -> Optional[List[dict]]:
        """Train to the end; rank 0 returns the metric history (small dicts only).
        ``started_at``: when the job started (the driver's start, ``time.time()``);
        ``monitor``: the job's heartbeat monitor actor (``siirl.launch.heartbeat``)."""
        from siirl.launch.heartbeat import Beater

        built: dict = {}  # the DAGWorker once built: its step goes with each heartbeat
        beater = Beater(monitor, self.rank,
                        lambda: getattr(built.get("worker"), "global_step", None))
        if monitor is not None:
            beater.start()
        try:
            return self._run(master_addr, master_port, graph, group_ranks, started_at, built)
        finally:
            beater.stop()

    def _run(self, master_addr: str, master_port: int, graph: Any,
             group_ranks: Sequence[Sequence[int]], started_at: Optional[float],
             built: dict) -> Optional[List[dict]]:
        from siirl.dag_worker.dagworker import DAGWorker
        from siirl.dag_worker.walk.collective import WorkerComm
        from siirl.dag_worker.walk.engines import roles_needed
        from siirl.dag_worker.walk.layouts import sequence_parallel_sizes
        from siirl.dag_worker.walk.trainer_loop import Trainer
        from siirl.execution.device import device_kind
        from siirl.execution.scheduler.process_group_manager import (
            ProcessGroupManager,
            backend_for,
            init_distributed,
            shutdown_distributed,
        )

        kind = device_kind(self.config)
        if kind == "cuda":
            import torch

            torch.cuda.set_device(0)  # Ray shows each GPU worker exactly its own GPU
        backend = backend_for(kind)
        timeout = float(self.config.trainer.dist_timeout_s)
        init_distributed(self.rank, self.world_size, master_addr, master_port, backend,
                         timeout)
        groups = ProcessGroupManager(self.rank, group_ranks, sorted(roles_needed(graph)),
                                     backend, timeout, sequence_parallel_sizes(self.config))
        if self.config.async_training.enable:  # rollout and trainer workers apart
            from siirl.dag_worker.async_training.entry import run_worker

            history = run_worker(self.rank, graph, self.config, groups, backend, started_at,
                                 built)
            shutdown_distributed()
            return history if self.rank == 0 else None
        comm = WorkerComm(self.rank, self.world_size, groups.world_control)
        worker = DAGWorker(graph, self.config, rank=groups.group_rank,
                           world_size=groups.group_size, comm=comm, process_groups=groups)
        built["worker"] = worker
        history = Trainer(worker, started_at=started_at).fit()
        shutdown_distributed()  # only after success: a failed peer would never answer
        return history if self.rank == 0 else None
