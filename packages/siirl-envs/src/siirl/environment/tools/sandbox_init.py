"""The local sandbox's own process: ``python -I sandbox_init.py SPEC``, started by
:func:`siirl.environment.tools.sandbox.run_python`. Standard library only (it runs
isolated from the trainer's imports).

It enters new user, mount, pid, network, IPC and UTS namespaces, then forks the new pid
namespace's first process (pid 1). That process builds the agent's filesystem view on a
tmpfs (read-only binds of the paths in ``spec["read_only"]``, a few ``/dev`` nodes, a fresh
``/proc``, size-capped tmpfs ``/tmp`` and work folder), ``pivot_root``s into it, starts the
agent's Python with the resource limits and no capabilities, and waits for it. When the
agent's process ends, pid 1 exits and the kernel kills everything left in the namespace.

User ids: as root the namespace maps its root to host root (for the setup only) and its
uid 1 to host ``nobody``, and the agent runs as uid 1, so ``RLIMIT_NPROC`` (which never
applies to host root) bounds its processes; an ordinary user can map only itself, so the
agent runs as the namespace's root with every capability dropped.

Status lines go to the file descriptor ``spec["status_fd"]``: ``exit <wait status>`` (the
agent's) or ``error <text>`` (the sandbox could not be built).
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import select
import signal
import sys

# Runs in the agent's process before main.py. The network namespace is the barrier; the
# refusing socket constructors only give the agent a clear error in its own process.
AGENT_RUNNER = r"""
import socket, _socket, sys
def _blocked(*args, **kwargs):
    raise PermissionError("network access is disabled in the sandbox")
for _mod, _names in ((socket, ("socket", "SocketType", "create_connection",
                               "socketpair", "fromfd", "create_server",
                               "getaddrinfo")),
                     (_socket, ("socket", "socketpair", "getaddrinfo"))):
    for _name in _names:
        if hasattr(_mod, _name):
            setattr(_mod, _name, _blocked)
del _mod, _names, _name
sys.argv = ["main.py"]
with open("main.py") as _f:
    _code = compile(_f.read(), "main.py", "exec")
del _f
exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
"""

NAMESPACES = (0x10000000 | 0x00020000 | 0x20000000 | 0x40000000  # user, mount, pid, net
              | 0x08000000 | 0x04000000)                            # ipc, uts
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_STRICTATIME = 1024, 2048, 1 << 24
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "loongarch64": 41,
                  "ppc64le": 203, "ppc64": 203, "s390x": 217}
NOBODY = 65534  # host uid/gid of the agent when the sandbox is started by root
DEVICES = ("null", "zero", "full", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)),
           f"mount {source or ''} on {target}")


def _prctl(option: int, value: int = 0) -> None:
    _check(_libc.prctl(option, value, 0, 0, 0), f"prctl({option})")


def _report(status_fd: int, line: str) -> None:
    os.write(status_fd, (" ".join(line.split()) + "\n").encode(errors="replace"))


# -- the first process: namespaces and user ids --------------------------------------


def _write_id_maps(pid: int, uid: int, gid: int) -> None:
    """Run in a helper left outside the new user namespace (only it may map host ids)."""
    extra = f"1 {NOBODY} 1\n" if uid == 0 else ""
    with open(f"/proc/{pid}/setgroups", "w") as handle:
        handle.write("deny")
    with open(f"/proc/{pid}/uid_map", "w") as handle:
        handle.write(f"0 {uid} 1\n{extra}")
    with open(f"/proc/{pid}/gid_map", "w") as handle:
        handle.write(f"0 {gid} 1\n{extra}")


def _enter_namespaces(status_fd: int) -> None:
    uid, gid, me = os.geteuid(), os.getegid(), os.getpid()
    if uid == 0:
        try:
            os.setgroups([])  # no host supplementary groups inside
        except OSError:
            pass  # not allowed here (e.g. already in a user namespace): only our own groups
    ready_r, ready_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        os.close(ready_w)
        code = 1
        if os.read(ready_r, 1) == b"1":
            try:
                _write_id_maps(me, uid, gid)
                code = 0
            except OSError as exc:
                _report(status_fd, f"error cannot map user ids into the sandbox's user "
                                   f"namespace: {exc}")
        os._exit(code)
    os.close(ready_r)
    try:
        _check(_libc.unshare(NAMESPACES),
               "unshare(user, mount, pid, network, ipc, uts namespaces)")
        os.write(ready_w, b"1")
    finally:
        os.close(ready_w)
    if os.waitpid(helper, 0)[1] != 0:
        os._exit(1)  # the helper reported why


def main() -> None:
    with open(sys.argv[1], "rb") as handle:
        spec = marshal.load(handle)  # marshal, not json: the start of every call is faster
    status_fd = int(spec["status_fd"])
    os.set_inheritable(status_fd, False)  # the agent's program never gets it
    try:
        _enter_namespaces(status_fd)
    except OSError as exc:
        _report(status_fd, f"error {exc}")
        os._exit(1)
    alive_r, alive_w = os.pipe()  # closes when this process dies
    init = os.fork()
    if init == 0:
        os.close(alive_w)
        _namespace_init(spec, status_fd, alive_r)
    os.close(alive_r)
    # the caller's wall-clock timeout arrives as SIGTERM: killing pid 1 empties the namespace
    signal.signal(signal.SIGTERM, lambda *_: os.kill(init, signal.SIGKILL))
    os.waitpid(init, 0)  # returns once every process of the namespace is gone
    os._exit(0)


# -- pid 1 of the new pid namespace -----------------------------------------------------


def _namespace_init(spec: dict, status_fd: int, alive_r: int) -> None:
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if select.select([alive_r], [], [], 0)[0]:
            os._exit(1)  # the first process died before the line above
        _prctl(PR_SET_DUMPABLE, 0)  # the agent cannot ptrace its init
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # pid 1 ignores default-action signals
        with open(spec["code_path"], "rb") as handle:
            code = handle.read()
        new_root = os.path.join(spec["base"], "root")
        _build_root(spec, new_root, code)
        _pivot_root(new_root)
        _refuse_nested_user_namespaces()
        agent = os.fork()
        if agent == 0:
            _exec_agent(spec, status_fd)
        _drop_bounding_set()
        _clear_capabilities()
        while True:
            pid, wait_status = os.wait()
            if pid == agent:
                break
        _report(status_fd, f"exit {wait_status}")
    except BaseException as exc:  # noqa: BLE001 (any failure is reported, not raised)
        _report(status_fd, f"error {type(exc).__name__}: {exc}")
        os._exit(1)
    os._exit(0)  # the kernel now kills whatever the agent left running


def _agent_ids(spec: dict) -> tuple[int, int]:
    return (1, 1) if spec["host_root"] else (0, 0)


def _build_root(spec: dict, new_root: str, code: bytes) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
    _mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096,mode=755")
    size = f"size={int(spec['writable_mb'])}m,nr_inodes=16384"
    dev = new_root + "/dev"
    for folder in (dev + "/shm", new_root + "/tmp"):  # first: a prefix may lie under /tmp
        os.makedirs(folder, exist_ok=True)
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
    bound = [target for target in (_bind(path, new_root + path) for path in spec["read_only"])
             if target]
    for point in _mount_points_under(bound):  # each, with what it holds, read-only
        _remount_read_only(point)
    for name in DEVICES:
        open(os.path.join(dev, name), "w").close()
        _mount("/dev/" + name, os.path.join(dev, name), None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, os.path.join(dev, name))
    os.makedirs(new_root + "/proc", exist_ok=True)
    try:
        _mount("proc", new_root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        pass  # e.g. a container that masks parts of its /proc: the agent gets no /proc
    uid, gid = _agent_ids(spec)
    work = new_root + spec["work"]
    os.makedirs(work, exist_ok=True)
    _mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=700,uid={uid},gid={gid}")
    with open(os.path.join(work, "main.py"), "wb") as handle:
        handle.write(code)
    os.chown(os.path.join(work, "main.py"), uid, gid)
    os.makedirs(new_root + "/etc", exist_ok=True)
    with open(new_root + "/etc/passwd", "w") as handle:
        handle.write(f"root:x:0:0:root:/:/usr/sbin/nologin\n"
                     f"sandbox:x:1:1:sandbox:{spec['work']}:/usr/sbin/nologin\n")
    with open(new_root + "/etc/group", "w") as handle:
        handle.write("root:x:0:\nsandbox:x:1:\n")


def _bind(source: str, target: str) -> str | None:
    """Bind ``source`` (with its submounts) at ``target``; the target, or None where no
    mount was needed (a symlink, like ``/lib -> usr/lib``, is made again) or possible."""
    if os.path.islink(source):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(os.readlink(source), target)
        return None
    if not os.path.exists(source):
        return None
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "w").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    return target


def _mount_points_under(targets: list[str]) -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            point = _unescape(line.split()[4])
            if any(point == t or point.startswith(t.rstrip("/") + "/") for t in targets):
                points.append(point)
    return points


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def _remount_read_only(point: str) -> None:
    """Read-only, keeping the flags the kernel locks on mounts from the host."""
    flag_of = os.statvfs(point).f_flag
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
    for st_flag, ms_flag in ((os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                             (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME)):
        if flag_of & st_flag:
            flags |= ms_flag
    if not flag_of & (os.ST_NOATIME | os.ST_RELATIME):
        flags |= MS_STRICTATIME
    _mount(None, point, None, flags)


def _pivot_root(new_root: str) -> None:
    machine = os.uname().machine
    number = SYS_PIVOT_ROOT.get(machine)
    if number is None:
        raise OSError(f"no pivot_root system call number known for {machine}")
    os.chdir(new_root)
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the host's root")  # the old root
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _refuse_nested_user_namespaces() -> None:
    """A nested user namespace would give the agent capabilities there; none are allowed."""
    try:
        with open("/proc/sys/user/max_user_namespaces", "w") as handle:
            handle.write("0")
    except OSError:
        pass  # no /proc: nested namespaces still see every mount locked read-only


def _drop_bounding_set() -> None:
    """No capability can come back, even through exec of a file or as uid 0."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the kernel's last capability
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


def _clear_capabilities() -> None:
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()                  # effective, permitted, inheritable: none
    _check(_libc.capset(header, data), "capset")


def _exec_agent(spec: dict, status_fd: int) -> None:
    try:
        os.chdir(spec["work"])
        limits = spec["limits"]
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["fsize"],) * 2)
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu"], limits["cpu"] + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits["memory"],) * 2)
        # an ordinary user's setup processes count against the same user id
        nproc = limits["processes"] + (0 if spec["host_root"] else 2)
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        uid, gid = _agent_ids(spec)
        _drop_bounding_set()
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        _clear_capabilities()
        python = spec["python"]
        os.execve(python, [python, "-I", "-c", AGENT_RUNNER], spec["env"])
    except BaseException as exc:  # noqa: BLE001
        _report(status_fd, f"error starting the agent's python: {type(exc).__name__}: {exc}")
    os._exit(127)


if __name__ == "__main__":
    main()
