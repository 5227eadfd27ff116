"""Anonymous shared-memory files that ranks on one node map to hand rows to each other.

Each rank owns one staging file (``memfd_create``), created once and grown in place. Its
same-node peers open it through ``/proc/<pid>/fd/<fd>`` and keep it mapped, so after the
first transfer neither side pays for page faults again: a row costs one copy into the
sender's staging and one copy out of it into the receiver's result. The file has no
name, so the kernel frees it when its last descriptor and mapping go, however the
processes end (an error, a kill): there is nothing to clean up in /dev/shm, and the size
limit of a /dev/shm mount (64 MB in a default container) does not apply.

Linux only; ``node_key()`` is None elsewhere, and the DataBuffer then uses its transport.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
from pathlib import Path

import torch

__all__ = ["ENV", "Mapping", "Staging", "enabled", "node_key", "open_peer"]

ENV = "SIIRL_DATABUFFER_SHM"  # "0" forces the transport (gloo) for every pair
PAGE = mmap.PAGESIZE


def enabled(setting: bool | None = None) -> bool:
    """An explicit setting wins; else the environment variable (default: on)."""
    if setting is not None:
        return bool(setting)
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@functools.cache
def node_key() -> str | None:
    """Equal on ranks that can open each other's staging: the same kernel boot and the
    same pid namespace (``/proc/<pid>`` names the peer), and the same cluster node
    (``SIIRL_NODE_ID``, set by the launcher: nodes that share a machine, as in tests, still
    exchange rows as separate machines would). None where memfd or /proc lack."""
    if not hasattr(os, "memfd_create"):
        return None
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pidns = os.stat("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{pidns.st_dev}:{pidns.st_ino}/{os.environ.get('SIIRL_NODE_ID', '')}"


class Mapping:
    """A shared mapping of one memfd as a flat uint8 tensor; remapped when it must grow."""

    def __init__(self, fd: int):
        self.fd = fd
        self._mm: mmap.mmap | None = None
        self._bytes: torch.Tensor | None = None

    def tensor(self, size: int) -> torch.Tensor:
        """At least ``size`` bytes of the file, mapped (the whole file, pages populated)."""
        if self._bytes is None or self._bytes.numel() < size:
            self._unmap()
            length = max(size, os.fstat(self.fd).st_size)
            if length == 0:
                return torch.empty(0, dtype=torch.uint8)
            # MAP_POPULATE: one call maps every page instead of a fault per 4 KiB page.
            self._mm = mmap.mmap(self.fd, length, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
            self._bytes = torch.frombuffer(self._mm, dtype=torch.uint8)
        return self._bytes

    def write(self, offset: int, data: bytes) -> None:
        self.tensor(offset + len(data))
        self._mm[offset : offset + len(data)] = data

    def read(self, offset: int, length: int) -> bytes:
        self.tensor(offset + length)
        return self._mm[offset : offset + length]

    def _unmap(self) -> None:
        self._bytes = None
        if self._mm is not None:
            # A view still alive keeps the mapping until it goes (BufferError): harmless.
            with contextlib.suppress(BufferError):
                self._mm.close()
            self._mm = None

    def close(self) -> None:
        self._unmap()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Staging(Mapping):
    """This rank's own staging file: rows for same-node peers are written here."""

    def __init__(self):
        super().__init__(os.memfd_create("siirl-databuffer", os.MFD_CLOEXEC))
        stat = os.fstat(self.fd)
        # What a peer needs to open the file and check that it opened the right one.
        self.identity = (os.getpid(), self.fd, stat.st_dev, stat.st_ino)

    def reserve(self, size: int) -> None:
        """Grow the file to hold ``size`` bytes. The pages are allocated here, so a lack of
        memory is an OSError now, not a SIGBUS on some later write into the mapping."""
        have = os.fstat(self.fd).st_size
        if size > have:
            want = -(-max(size, have + have // 4) // PAGE) * PAGE  # grow by >= 25%
            os.posix_fallocate(self.fd, 0, want)


def open_peer(identity: tuple) -> Mapping | None:
    """Open a same-node peer's staging file, or None where it cannot be reached (another
    user, a hardened /proc, a process gone, or a different file under that number)."""
    pid, fd, dev, ino = identity
    try:
        mine = os.open(f"/proc/{int(pid)}/fd/{int(fd)}", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    stat = os.fstat(mine)
    if (stat.st_dev, stat.st_ino) != (dev, ino):
        os.close(mine)
        return None
    return Mapping(mine)
