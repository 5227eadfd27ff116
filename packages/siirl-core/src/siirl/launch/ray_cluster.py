"""Join (or start) the Ray cluster and reserve one bundle per worker, one node per group.

Which cluster: ``siirl.launch.cluster_link``. An address the user names
(``trainer.ray_address``, ``RAY_ADDRESS``) must accept a TCP connection within
``trainer.ray_connect_timeout_s`` before Ray is asked to join it, and joining must finish
within as long again: Ray itself retries an unreachable set-up for minutes without saying so.

``trainer.ray_node_ip`` is this machine's address as the cluster knows its nodes. Ray
rewrites a loopback address (given as the cluster's address or as the node's) into the
machine's interface address, so that other machines can reach it; a cluster whose nodes
were started on the loopback (several nodes on one machine) is then out of reach. With a
loopback node address asked for, that rewriting is turned off for this process.

``trainer.nnodes`` placement groups of ``trainer.n_gpus_per_node`` bundles: with more than
one node, each group is packed onto one node and the groups onto distinct nodes (Ray's
placement target per group, then checked), so the workers of a group share a node and its
fast paths (shared memory, NVLink) while the groups spread over the cluster.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Optional

from siirl.errors import ConfigError
from siirl.launch.cluster_link import (
    LOCAL_OVERRIDE,
    ClusterLink,
    check_recorded,
    choose,
    host_port,
)
from siirl.params import SiiRLArguments


def wait_reachable(address: str, timeout_s: float, named: Optional[str] = None) -> None:
    """Return once ``address`` accepts a TCP connection; ConfigError after ``timeout_s``.
    ``named``: how the message names the address (default: as trainer.ray_address)."""
    target = host_port(address)
    if target is None:
        return
    deadline = time.monotonic() + timeout_s
    error: OSError | None = None
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection(target, timeout=max(0.1, min(5.0, left))):
                return
        except OSError as exc:
            error = exc
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"{named or f'trainer.ray_address={address}'}: no Ray cluster answers there "
                f"within {timeout_s:g} s ({error.strerror or error}); start it (`ray start "
                f"--head --port={target[1]}`), fix the address, or add {LOCAL_OVERRIDE} to run "
                "on a private cluster this command starts and stops "
                "(trainer.ray_connect_timeout_s sets the wait)")
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_address(address: str, node_ip: str | None, timeout_s: float,
                  named: Optional[str] = None) -> None:
    """ConfigError, within ``timeout_s``, unless the address Ray will dial answers."""
    import ray

    wait_reachable(address, timeout_s, named)
    target = host_port(address)
    if target is None or node_ip or not _is_loopback(target[0]) or "://" in address:
        return
    # Ray dials a loopback address through this machine's interface address
    rewritten = f"{ray.util.get_node_ip_address()}:{target[1]}"
    try:
        wait_reachable(rewritten, min(timeout_s, 5.0))
    except ConfigError:
        raise ConfigError(
            f"{named or f'trainer.ray_address={address}'}: the cluster answers on the loopback "
            "only, and "
            f"Ray joins a loopback address through this machine's interface address "
            f"({rewritten}), where nothing answers; a cluster whose nodes run on the "
            "loopback (`ray start --node-ip-address=127.0.0.1`) needs "
            "trainer.ray_node_ip=127.0.0.1") from None


class _JoinWatchdog:
    """Ends the process with a one-line error if joining the cluster hangs: Ray retries
    some unreachable set-ups for many minutes, in native code a signal cannot cut short."""

    def __init__(self, named: str, timeout_s: float):
        self.timer = threading.Timer(timeout_s, self._fire, (named, timeout_s))
        self.timer.daemon = True

    @staticmethod
    def _fire(named: str, timeout_s: float) -> None:
        import sys

        sys.stderr.write(f"siirl-train: error: {named}: joining the "
                         f"Ray cluster did not finish within {timeout_s:g} s; check the "
                         "address, trainer.ray_node_ip (this machine's address as the "
                         "cluster knows it) and that this machine runs a node of the "
                         "cluster (`ray start --address=...`)\n")
        sys.stderr.flush()
        os._exit(2)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.timer.cancel()


def pin_node_ip(node_ip: str | None) -> dict:
    """ray.init's arguments for this node's address (see the module's docstring)."""
    if not node_ip:
        return {}
    if ipaddress.ip_address(node_ip).is_loopback:
        # private, but the only switch: services.get_node_ip_address() returns the
        # loopback address, instead of the interface's, while it is off
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
    return {"_node_ip_address": node_ip}


def start_ray(config: SiiRLArguments, num_workers: int) -> ClusterLink:
    """Join or start Ray (which: ``cluster_link.choose``); the link says which cluster and
    whether this call started it (then it is ours to stop)."""
    import ray

    link = choose(config)
    if ray.is_initialized():  # the caller's own session (tests, notebooks)
        link.address, link.source, link.key = None, "this process's own Ray session", None
        link.gcs = ray.get_runtime_context().gcs_address
        return link
    node_ip = config.trainer.ray_node_ip
    node = pin_node_ip(node_ip)
    # Ray's "Started a local Ray instance" / "Connected to Ray cluster": the link says it
    node["logging_level"] = logging.WARNING
    if link.address:
        timeout_s = config.trainer.ray_connect_timeout_s
        if link.recorded:
            check_recorded(link)
        else:
            check_address(link.address, node_ip, timeout_s, link.named)
        with _JoinWatchdog(link.named, timeout_s), _without_ray_address_env():
            try:
                ray.init(address=link.address, log_to_driver=True, ignore_reinit_error=True,
                         **node)
            except ConnectionError as exc:
                raise ConfigError(link.unreachable(str(exc).splitlines()[0])) from None
        link.gcs = ray.get_runtime_context().gcs_address
        return link
    temp_dir = config.trainer.ray_temp_dir or tempfile.mkdtemp(prefix="ray")
    kwargs = {"include_dashboard": False, "_temp_dir": str(temp_dir),
              "object_store_memory": 256 * 1024 ** 2,  # batches never go through it
              "log_to_driver": True, **node}
    # one logical CPU per worker even on a small machine (CPU workers, tests); GPUs are
    # detected by Ray itself
    kwargs["num_cpus"] = max(num_workers, os.cpu_count() or 1)
    with _children_ignore_ctrl_c(), _without_ray_address_env():
        ray.init(**kwargs)
    link.started = True
    link.gcs = ray.get_runtime_context().gcs_address
    return link


@contextlib.contextmanager
def _without_ray_address_env():
    """Ray lets ``RAY_ADDRESS`` override the address ray.init is given; ``choose`` has
    already read it, and the cluster it picked is the one joined or started."""
    old = os.environ.pop("RAY_ADDRESS", None)
    try:
        yield
    finally:
        if old is not None:
            os.environ["RAY_ADDRESS"] = old


def colourless_worker_logs() -> None:
    """Ray prefixes each forwarded worker line with a coloured ``(WorkerProcess pid=...)``;
    when the console is not a terminal (a log file, a pipe) the colour codes are noise."""
    on_terminal = all(getattr(stream, "isatty", lambda: False)() for stream in
                      (sys.stdout, sys.stderr))
    if "RAY_COLOR_PREFIX" not in os.environ and not on_terminal:
        os.environ["RAY_COLOR_PREFIX"] = "0"


@contextlib.contextmanager
def _children_ignore_ctrl_c():
    """Ctrl-C goes to the terminal's whole foreground process group, which holds the local
    cluster's processes (GCS, raylet) too. Started with SIGINT ignored (inherited across
    exec), they stay up for the driver's clean-up (kill the workers, stop the cluster),
    which otherwise races their death and can block on the dead GCS."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
