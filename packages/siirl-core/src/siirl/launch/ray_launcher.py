"""Run the planned workers as Ray actors: one per device, in placement groups.

The driver (this process) joins a running Ray cluster, or starts a local one, reserves one
bundle per worker (``trainer.nnodes`` placement groups of ``trainer.n_gpus_per_node``
bundles, each a GPU, or a CPU with ``trainer.device=cpu``; an asynchronous job's rollout
workers in ``rollout.nnodes`` more: ``placement``), starts one
:class:`WorkerProcess` per bundle and hands each its TaskGraph and the rendezvous address.
From then on it only waits: it never receives batch data, only rank 0's metric history.

Failure: the first worker that raises or dies ends the job. The driver kills the other
workers (which may be blocked in a collective with the dead one) and raises
:class:`WorkerFailedError` naming the worker's rank, pid and host with its traceback. A
worker that dies makes its peers' collectives fail too: of the failures that arrive within
``FAILURE_SETTLE_S``, a death is reported before a peer's error. A worker that stops
responding (stopped, hung) is found by its heartbeats (``siirl.launch.heartbeat``) after
``trainer.heartbeat_timeout_s`` and reported the same way.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, List, Optional

from siirl.dag_worker.walk import startup
from siirl.errors import SiirlError, WorkerFailedError
from siirl.execution.scheduler.task_scheduler import WorkerAssignment
from siirl.launch import signals
from siirl.launch.cluster_link import ClusterWatch
from siirl.launch.heartbeat import CHECK_S, describe
from siirl.launch.placement import bundle_of, placement_groups, worker_pools
from siirl.launch.ray_cluster import colourless_worker_logs, start_ray
from siirl.params import SiiRLArguments

LOG_FLUSH_S = 1.0
FAILURE_SETTLE_S = 3.0  # a dead worker's peers may fail first: wait for its death too


def _describe(info: dict) -> str:
    return f"worker rank {info['rank']} (pid {info['pid']} on {info['node_ip']})"


def _failure(exc: Exception, info: dict) -> SiirlError:
    from ray.exceptions import RayActorError, RayTaskError

    where = _describe(info)
    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        wanted = os.environ.get("SIIRL_TRACEBACK", "") not in ("", "0")
        if isinstance(cause, SiirlError) and not isinstance(cause, WorkerFailedError) \
                and not wanted:
            # a user error (config, data, plugin): one line, as for a single worker
            error = type(cause)(f"{where}: {cause}")
            error.exit_code = getattr(cause, "exit_code", 1)
            return error
        return WorkerFailedError(f"{where} failed; the job was stopped. Its traceback:\n"
                                 f"{exc}", info["rank"])
    if isinstance(exc, RayActorError):
        return WorkerFailedError(f"{where} died (killed, out of memory or crashed); the job "
                                 f"was stopped. Ray says: {str(exc).strip()[:500]}",
                                 info["rank"])
    return WorkerFailedError(f"{where}: {exc}", info["rank"])


def _record_workers(config: SiiRLArguments, infos: List[dict]) -> None:
    """``<default_local_dir>/workers.json``: who runs where (for operators and tests)."""
    directory = Path(config.trainer.default_local_dir)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "workers.json").write_text(json.dumps(
        [{k: info[k] for k in ("rank", "pid", "node_ip", "node_id", "host")}
         for info in infos], indent=1))
    if len({info["node_id"] for info in infos}) > 1:  # where each worker landed
        for info in infos:
            print(f"siirl: worker rank {info['rank']} on {info['host']} ({info['node_ip']}, "
                  f"Ray node {info['node_id'][:8]}), pid {info['pid']}", flush=True)


def _first_failure(failed: dict, infos: List[dict]) -> SiirlError:
    """The failure to report among ``{rank: exception}``: a worker that died before the
    peers whose collectives then failed, else the lowest rank's."""
    from ray.exceptions import RayActorError

    died = [rank for rank, exc in failed.items() if isinstance(exc, RayActorError)]
    rank = min(died) if died else min(failed)
    return _failure(failed[rank], infos[rank])


def _wait(pending: dict, infos: List[dict], monitor: Any, heartbeat_timeout_s: float
          ) -> Optional[list]:
    """Wait for every worker's ``run``; rank 0's result. The first failure, or a worker
    silent past the heartbeat timeout, raises."""
    import ray

    history = None
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=CHECK_S)
        if not ready:
            silent = ray.get(monitor.silent.remote(heartbeat_timeout_s), timeout=60)
            if silent:
                raise WorkerFailedError(
                    f"{describe(silent[0])} (trainer.heartbeat_timeout_s="
                    f"{heartbeat_timeout_s:g}); the job was stopped", silent[0]["rank"])
            continue
        rank = pending.pop(ready[0])
        try:
            result = ray.get(ready[0])
        except Exception as exc:  # a failure ends the job: gather the ones it causes
            failed = {rank: exc}
            more, _ = ray.wait(list(pending), num_returns=len(pending),
                               timeout=FAILURE_SETTLE_S)
            for ref in more:
                try:
                    ray.get(ref)
                except Exception as other:
                    failed[pending[ref]] = other
            raise _first_failure(failed, infos) from None
        if rank == 0:
            history = result
    time.sleep(LOG_FLUSH_S)  # let Ray forward the workers' last log lines
    return history


def launch_ray(config: SiiRLArguments, plan: List[WorkerAssignment]) -> Optional[list]:
    import ray

    from siirl.execution.device import device_kind
    from siirl.launch.heartbeat import HeartbeatMonitor
    from siirl.launch.worker_process import WorkerProcess

    started_at = startup.process_started()
    num_workers = len(plan)
    device = config.trainer.device.lower()
    if device not in ("auto", "cpu"):
        device_kind(config)  # validates the name
    colourless_worker_logs()
    link = start_ray(config, num_workers)
    link.announce(config.trainer.ray_temp_dir if link.started else None)
    signals.reinstall()
    actors, groups = [], []
    watch = ClusterWatch(link).start()  # a lost cluster ends the command within seconds
    try:
        # auto: GPU workers when the cluster has GPUs (the driver itself may have none)
        on_gpu = device == "cuda" or (device == "auto" and
                                      ray.cluster_resources().get("GPU", 0) > 0)
        pools = worker_pools(config, num_workers)
        groups = placement_groups(pools, on_gpu)
        remote = ray.remote(WorkerProcess)
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        for rank in range(num_workers):
            group, index = bundle_of(rank, pools)
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=groups[group], placement_group_bundle_index=index)
            actors.append(remote.options(
                num_cpus=1, num_gpus=1 if on_gpu else 0, max_restarts=0,
                scheduling_strategy=strategy,
            ).remote(rank, num_workers, config))
        infos = ray.get([actor.address.remote() for actor in actors])
        _record_workers(config, infos)
        watch.workers = infos
        group_ranks = [list(a.group_ranks) or list(range(num_workers)) for a in plan]
        master = infos[0]
        monitor = ray.remote(num_cpus=0)(HeartbeatMonitor).remote()
        actors.append(monitor)  # killed with the workers
        pending = {actor.run.remote(master["node_ip"], master["port"], plan[rank].graph,
                                    group_ranks, started_at, monitor): rank
                   for rank, actor in enumerate(actors[:num_workers])}
        startup.settle()  # this process only waits from here on
        return _wait(pending, infos, monitor,
                     config.trainer.heartbeat_timeout_s)
    except Exception:
        if watch.gone():  # the workers failed because the cluster went away: say that
            watch.end_local_workers()
            raise WorkerFailedError(link.lost(), 0) from None
        raise
    finally:
        watch.stop()
        if not watch.gone():  # else there is no one left to ask
            for actor in actors:
                ray.kill(actor, no_restart=True)
            for group in groups:
                ray.util.remove_placement_group(group)
        if link.started:
            ray.shutdown()
