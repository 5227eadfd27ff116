"""Which Ray cluster a multi-worker run uses, said on the console, and watched while it runs.

Which one (``trainer.ray_address``):

- ``local``: a private cluster this command starts and stops;
- an address (or, with the key null, ``RAY_ADDRESS``): that cluster;
- null, without ``RAY_ADDRESS``: the cluster ``ray start`` recorded on this machine (Ray's
  ``ray_current_cluster`` file under ``$RAY_TMPDIR`` or ``/tmp``/ray), else a private one.
  Clusters that other programs started with ``ray.init()`` are never joined (Ray's
  ``address="auto"`` joins any it finds among the machine's processes: another job's).

The command prints which cluster it joined, or that it started one. A recorded cluster that
no longer answers stops the command at once (a TCP check of its address) with one paragraph
naming the address and ``trainer.ray_address=local``. A cluster that stops answering while
the job runs (its owner stopped it) ends the command within seconds with the same kind of
paragraph, where Ray would wait 60 s and end it with its own GCS error.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any, Optional

from siirl.params import SiiRLArguments

WATCH_EVERY_S = 2.0
# refused connections in a row before the cluster counts as gone (a GCS restarted by Ray's
# fault tolerance is back within that); a check that times out (the network, a busy head)
# counts for nothing: Ray's own 60 s limit covers those
WATCH_MISSES = 5
RECORDED_CHECK_S = 2.0
LOCAL_OVERRIDE = "trainer.ray_address=local"
RECORDED = "`ray start` recorded"


def host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of ``[ray://]host:port``; None for forms without a port."""
    address = address.split("://", 1)[-1]
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def refusal(address: str, timeout_s: float = 2.0) -> Optional[str]:
    """Why ``host:port`` accepts no TCP connection now; None when it does."""
    target = host_port(address)
    if target is None:
        return None  # nothing to check: Ray resolves it
    try:
        with socket.create_connection(target, timeout=timeout_s):
            return None
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)


def recorded_cluster_file() -> str:
    """Where ``ray start`` records the cluster it started (Ray's own rule)."""
    from ray._common.utils import get_ray_address_file

    return get_ray_address_file(None)


@dataclass
class ClusterLink:
    """The cluster chosen: ``address`` None means a private one is started."""

    address: Optional[str]
    source: str  # how it was chosen, for the messages
    key: Optional[str] = None  # the setting that named the address, if one did
    started: bool = False
    gcs: Optional[str] = None  # the address joined or started, once known

    @property
    def shown(self) -> str:
        return self.gcs or self.address or "(not started)"

    @property
    def recorded(self) -> bool:
        """Found in ``ray start``'s record, not named by the user."""
        return self.source.startswith(RECORDED)

    @property
    def named(self) -> str:
        """How the messages name the address: as the user gave it, or where it was found."""
        if self.key:
            return f"{self.key}={self.address}"
        return f"the address {self.source} ({self.address})"

    def announce(self, temp_dir: Optional[str] = None, stream: Any = None) -> None:
        if self.started:
            where = f"; Ray's files in {temp_dir}" if temp_dir else ""
            line = (f"siirl: started a private Ray cluster at {self.shown} for this command "
                    f"(it stops when the command ends{where})")
        else:
            line = (f"siirl: joined the Ray cluster at {self.shown} ({self.source}), which this "
                    "command did not start: other jobs may use it and stop it; "
                    f"{LOCAL_OVERRIDE} runs on a private one")
        print(line, file=stream or sys.stdout, flush=True)

    def unreachable(self, why: str) -> str:
        """One paragraph: the cluster to be joined does not answer."""
        port = host_port(self.address or "")
        restart = f"`ray start --head --port={port[1]}`" if port else "`ray start --head`"
        return (f"{self.named}: no Ray cluster answers there ({why}): it has stopped, or it "
                "was another job's and that job ended. Add "
                f"{LOCAL_OVERRIDE} to run on a private cluster this command starts and "
                f"stops, or start that cluster again ({restart})")

    def lost(self) -> str:
        """One paragraph: the cluster stopped answering while the job ran."""
        if self.started:
            whose = ("the private Ray cluster this command started at "
                     f"{self.shown} stopped answering while the job ran (killed: `ray stop` "
                     "on this machine stops every cluster of this user, or out of memory)")
            fix = "run the command again"
        else:
            whose = (f"the Ray cluster at {self.shown} ({self.source}; this command did not "
                     "start it) stopped answering while the job ran: its owner stopped it, "
                     "or it crashed")
            fix = f"add {LOCAL_OVERRIDE} to run on a private cluster this command starts"
        return (f"{whose}. The job was stopped. To go on, {fix} (a run resumes from the "
                "newest checkpoint in its trainer.default_local_dir)")


def choose(config: SiiRLArguments) -> ClusterLink:
    """The cluster ``trainer.ray_address`` (or the environment) names; see the docstring."""
    address = config.trainer.ray_address
    if address == "local":
        return ClusterLink(None, LOCAL_OVERRIDE)
    if address and address != "auto":
        return ClusterLink(str(address), "named by trainer.ray_address", "trainer.ray_address")
    env = os.environ.get("RAY_ADDRESS", "")
    if env == "local":
        return ClusterLink(None, "RAY_ADDRESS=local")
    if env and env != "auto":
        return ClusterLink(env, "named by RAY_ADDRESS", "RAY_ADDRESS")
    path = recorded_cluster_file()
    try:
        with open(path, encoding="utf-8") as recorded:
            found = recorded.read().strip()
    except OSError:
        found = ""
    if not found:
        return ClusterLink(None, "no Ray cluster recorded on this machine")
    return ClusterLink(found, f"{RECORDED} in {path}")


def check_recorded(link: ClusterLink) -> None:
    """A recorded cluster is up or gone (``ray start`` records it once it runs): one quick
    check, not a wait."""
    from siirl.errors import ConfigError

    why = refusal(link.address, RECORDED_CHECK_S) if link.address and link.recorded else None
    if why:
        raise ConfigError(link.unreachable(why))


class ClusterWatch:
    """While the job runs: ends the command with ``link.lost()`` once the cluster's GCS has
    refused ``WATCH_MISSES`` checks in a row. Ray's own driver would wait 60 s, then exit
    with its raw GCS error."""

    def __init__(self, link: ClusterLink, every_s: float = WATCH_EVERY_S,
                 misses: int = WATCH_MISSES):
        self.link = link
        self.every_s = every_s
        self.misses = misses
        self.workers: list = []  # the workers' infos (pid, host) once they run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="siirl-cluster-watch",
                                        daemon=True)

    def gone(self) -> bool:
        """Whether the cluster's address refuses a connection now: nothing listens there."""
        target = host_port(self.link.gcs or "")
        if target is None:
            return False
        try:
            with socket.create_connection(target, timeout=self.every_s):
                return False
        except (ConnectionRefusedError, ConnectionResetError):
            return True
        except OSError:  # a timeout, the network: not proof
            return False

    def _run(self) -> None:
        missed = 0
        while not self._stop.wait(self.every_s):
            missed = missed + 1 if self.gone() else 0
            if missed >= self.misses and not self._stop.is_set():
                self.end_local_workers()
                sys.stdout.flush()
                sys.stderr.write(f"siirl-train: error: {self.link.lost()}\n")
                sys.stderr.flush()
                os._exit(1)

    def end_local_workers(self) -> None:
        """The workers on this machine: a node outlives its lost cluster for a while, and
        they would train on with no one to report to (elsewhere they end with their node)."""
        here = socket.gethostname()
        for info in self.workers:
            if info.get("host") == here:
                try:
                    os.kill(int(info["pid"]), signal.SIGKILL)
                except (OSError, ValueError):
                    pass  # already gone

    def start(self) -> ClusterWatch:
        if self.link.gcs:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
