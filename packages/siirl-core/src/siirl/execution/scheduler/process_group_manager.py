"""torch.distributed set-up for N workers: the world, per-role process groups, timeouts.

Every worker calls :func:`init_distributed` with the same rendezvous address, then builds a
:class:`ProcessGroupManager` from the same plan. ``new_group`` is collective over the whole
world and must be called in the same order everywhere, so groups are created for every
distinct rank set of the plan, in plan order, by every worker; each worker keeps the ones
it belongs to. Roles (actor, rollout, reference, ...) of one sub-graph run on the same
ranks, so they share that sub-graph's group: one communicator per rank set, not per role.
Data-plane groups use NCCL on GPU and gloo on CPU; a gloo group over the same ranks
carries control traffic (metrics, barriers, small objects), which NCCL cannot do without
a device copy. Every group has the configured timeout, so a dead peer makes collectives
fail instead of hang. Ulysses sequence parallelism (``ulysses_sequence_parallel_size`` s)
adds, per rank set, the groups of s consecutive ranks and the data-parallel groups across
them (:func:`sequence_groups`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import random
import socket
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

# above Ray's worker ports (10002-19999 by default)
_LOWEST_PICK = 20000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: IANA's range starts at 49152
        return 49152


def free_port() -> int:
    """A TCP port free on this host right now, drawn at random below the kernel's ephemeral
    range. A port bound to 0 comes from that range, where any process's outgoing connection
    (another job's gloo or Ray traffic) may take it before the caller listens on it
    (EADDRINUSE, seen with two jobs on one machine); ports below it are only ever bound
    on purpose. Drawn from the OS's randomness: seeded ``random`` would give two jobs
    with one seed the same ports."""
    low = _ephemeral_low()
    draw = random.SystemRandom()
    for _ in range(64 if low - _LOWEST_PICK >= 1000 else 0):
        port = draw.randrange(_LOWEST_PICK, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def node_ip() -> str:
    """This host's address as other nodes reach it (loopback when it has no other)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # no Ray here: a single-node run
        return "127.0.0.1"


def pin_gloo_interface(ip: str) -> None:
    """Gloo finds its own address from the host name, which may be another interface than
    the one the cluster uses (or unreachable for the peers): use the interface holding
    ``ip`` unless ``GLOO_SOCKET_IFNAME`` is set already."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addresses):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def init_distributed(rank: int, world_size: int, master_addr: str, master_port: int,
                     backend: str, timeout_s: float) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    dist.init_process_group(backend=backend, init_method=f"tcp://{master_addr}:{master_port}",
                            rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=float(timeout_s)))


def shutdown_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()  # nobody tears down while a peer still talks to it
        dist.destroy_process_group()


@contextlib.contextmanager
def as_default_group(group: Any) -> Iterator[None]:
    """Within: ``group`` stands for the world (``torch.distributed``'s default group: what
    ``get_world_size()``, ``get_rank()``, ``new_group`` and group-less collectives use);
    the world's own group comes back at the end."""
    from torch.distributed import distributed_c10d as c10d

    world = c10d._get_default_group()
    c10d._update_default_pg(group)
    try:
        yield
    finally:
        c10d._update_default_pg(world)


def sequence_groups(rank_sets: Sequence[Sequence[int]], size: int, rank: int, backend: str,
                    timeout: Optional[datetime.timedelta] = None) -> Optional[Tuple[Any, Any]]:
    """(sequence-parallel group, data-parallel group) of ``rank`` for groups of ``size``
    consecutive ranks of each rank set (the layout's order: they read the same rows), the
    data-parallel group joining the ranks at the same place of every such group; None when
    ``rank`` is in no set. Collective: every rank of the world calls it with the same
    arguments but its own ``rank``; sets whose length ``size`` does not divide are skipped
    (the layout refuses them with the key's name)."""
    import torch.distributed as dist

    mine = None
    for ranks in rank_sets:
        ranks = tuple(sorted(ranks))
        if len(ranks) % size:
            continue
        made = {}
        for kind, members in [("sp", ranks[i:i + size]) for i in range(0, len(ranks), size)] \
                + [("dp", ranks[j::size]) for j in range(size)]:
            group = dist.new_group(list(members), backend=backend, timeout=timeout)
            if rank in members:
                made[kind] = group
        if made:
            mine = (made["sp"], made["dp"])
    return mine


class ProcessGroupManager:
    """This worker's groups, from every worker's ``group_ranks`` (the plan); with
    ``sequence_parallel`` sizes above 1, their Ulysses groups too."""

    def __init__(self, rank: int, group_ranks: Sequence[Sequence[int]], roles: Sequence[str],
                 backend: str, timeout_s: float, sequence_parallel: Sequence[int] = ()):
        import torch.distributed as dist

        self.rank = rank
        world = dist.get_world_size()
        timeout = datetime.timedelta(seconds=float(timeout_s))
        self.ranks: Tuple[int, ...] = ()
        self.data_group: Any = None  # None: the default (world) group
        self.control_group: Any = None
        # the world's own backend may be NCCL; world-wide control traffic needs gloo
        self.world_control: Any = dist.new_group(backend="gloo", timeout=timeout) \
            if backend != "gloo" else None
        seen: List[Tuple[int, ...]] = []
        for ranks in group_ranks:
            key = tuple(sorted(ranks))
            if key in seen:
                continue
            seen.append(key)
            if len(key) == world:
                data, control = None, self.world_control
            else:
                data = dist.new_group(list(key), backend=backend, timeout=timeout)
                control = dist.new_group(list(key), backend="gloo", timeout=timeout) \
                    if backend != "gloo" else data
            if rank in key:
                self.ranks, self.data_group, self.control_group = key, data, control
        if rank not in self.ranks:
            raise ValueError(f"rank {rank} is in no group of the plan {list(group_ranks)}")
        self.roles: Dict[str, Any] = {role: self.data_group for role in roles}
        self.sequence: Dict[int, Tuple[Any, Any]] = {}
        for size in sorted({int(s) for s in sequence_parallel if int(s) > 1}):
            groups = sequence_groups(seen, size, rank, backend, timeout)
            if groups is not None:
                self.sequence[size] = groups

    @property
    def group_rank(self) -> int:
        return self.ranks.index(self.rank)

    @property
    def group_size(self) -> int:
        return len(self.ranks)

    def group_for(self, role: str) -> Optional[Any]:
        return self.roles.get(role, self.data_group)

    def sequence_groups(self, size: int) -> Optional[Tuple[Any, Any]]:
        """(sequence-parallel group, data-parallel group) for Ulysses groups of ``size``
        consecutive ranks of this worker's set; None when none were made."""
        return self.sequence.get(int(size))
