"""Environments in worker processes (``env_manager.env_processes`` > 0), so one that hangs,
crashes or is slow cannot stall or take down the training worker.

A pool of processes hosts the episodes' environments (spread round-robin); each turn the
env manager sends every process all of its environments' actions at once and waits at most
``env_manager.step_timeout_s`` for the answers. A process that misses the deadline is
killed (its environments' episodes end as ``timeout``), one that dies (a segfault, an
``os._exit``) ends its episodes as ``crash``; either way it is restarted for the next calls.
An environment that raises ends only its own episode (``step``), as in-process.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

from siirl.environment.base import StepResult, TextEnv
from siirl.environment.registry import make_env

START_TIMEOUT_S = 120.0


class EnvFailure(RuntimeError):
    """A remote environment call failed; ``kind`` is timeout, crash or step."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _build(env_type: Any, settings: Any) -> TextEnv:
    """A registered name, or a TextEnv class itself (importable by its module path)."""
    if isinstance(env_type, type):
        return env_type(**dict(settings or {}))
    return make_env(env_type, settings)


def _serve(conn: Any) -> None:
    """The worker process: a table of environments, calls in batches."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer handles Ctrl-C
    envs: Dict[int, TextEnv] = {}
    while True:
        try:
            calls = conn.recv()
        except (EOFError, OSError):
            return
        replies = []
        for op, env_id, args in calls:
            try:
                if op == "create":
                    env_type, settings, instructions = args
                    envs[env_id] = _build(env_type, settings)
                    if instructions is not None:
                        envs[env_id].instructions = instructions
                    value = None
                elif op == "close":
                    env = envs.pop(env_id, None)
                    value = env.close() if env is not None else None
                else:
                    value = getattr(envs[env_id], op)(*args)
                replies.append(("ok", value))
            except Exception as exc:
                replies.append(("error", f"{type(exc).__name__}: {exc} "
                                         f"[{traceback.extract_tb(exc.__traceback__)[-1].name}]"))
        conn.send(replies)


class _Process:
    def __init__(self, context: Any):
        self.conn, child = context.Pipe()
        self.proc = context.Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


class EnvWorkerPool:
    def __init__(self, processes: int, step_timeout_s: float):
        self.context = multiprocessing.get_context("forkserver")
        self.step_timeout_s = float(step_timeout_s)
        self.workers = [_Process(self.context) for _ in range(int(processes))]
        self._home: Dict[int, int] = {}  # env id -> worker index
        self._lost: Dict[int, str] = {}  # env id -> why its process went away
        self._next = 0

    def create(self, env_type: Any, settings: Any, instructions: Optional[str]) -> RemoteEnv:
        env_id = self._next
        self._next += 1
        self._home[env_id] = env_id % len(self.workers)
        local = _build(env_type, settings)  # for instructions and action parsing only
        if instructions is not None:
            local.instructions = instructions
        # a process's first call waits for its start-up (imports): a longer deadline
        created = self.call_many([(env_id, "create", (env_type, dict(settings or {}),
                                                      instructions))],
                                 timeout_s=max(START_TIMEOUT_S, self.step_timeout_s))[0]
        if isinstance(created, EnvFailure):
            raise created
        return RemoteEnv(self, env_id, local)

    def call_many(self, calls: Sequence[Tuple[int, str, tuple]],
                  timeout_s: Optional[float] = None) -> List[Any]:
        """Run ``(env id, op, args)`` calls, all processes at once, within ``timeout_s``
        (default ``step_timeout_s``); each result is the value or an :class:`EnvFailure`."""
        results: List[Any] = [None] * len(calls)
        by_worker: Dict[int, List[int]] = {}
        for index, (env_id, _, _) in enumerate(calls):
            if env_id in self._lost:
                results[index] = EnvFailure(self._lost[env_id], "its environment process "
                                            f"was lost earlier ({self._lost[env_id]})")
                continue
            by_worker.setdefault(self._home[env_id], []).append(index)
        for worker, indices in by_worker.items():
            self.workers[worker].conn.send([(calls[i][1], calls[i][0], calls[i][2])
                                            for i in indices])
        deadline = time.monotonic() + (self.step_timeout_s if timeout_s is None
                                       else timeout_s)
        for worker, indices in by_worker.items():
            process = self.workers[worker]
            kind = None
            try:
                if process.conn.poll(max(0.0, deadline - time.monotonic())):
                    replies = process.conn.recv()
                else:
                    kind = "timeout"
            except (EOFError, OSError):
                kind = "crash"
            if kind is not None:
                self._replace(worker, kind)
                for i in indices:
                    results[i] = EnvFailure(kind, (
                        f"no answer within env_manager.step_timeout_s={self.step_timeout_s:g}"
                        if kind == "timeout" else "its environment process died"))
                continue
            for i, (status, value) in zip(indices, replies, strict=True):
                results[i] = value if status == "ok" else EnvFailure("step", value)
        return results

    def _replace(self, worker: int, kind: str) -> None:
        """Kill and restart a process; every environment it hosted is lost."""
        self.workers[worker].kill()
        self.workers[worker] = _Process(self.context)
        for env_id, home in self._home.items():
            if home == worker:
                self._lost.setdefault(env_id, kind)

    def close(self) -> None:
        for process in self.workers:
            try:
                process.conn.send([])
            except OSError:
                pass
            process.kill()
        self.workers = []


class RemoteEnv(TextEnv):
    """A proxy of an environment hosted by an :class:`EnvWorkerPool` process."""

    def __init__(self, pool: EnvWorkerPool, env_id: int, local: TextEnv):
        self.pool, self.env_id, self.local = pool, env_id, local
        self.instructions = local.instructions

    def parse_action(self, reply: str) -> Optional[str]:
        return self.local.parse_action(reply)

    def _call(self, op: str, *args: Any) -> Any:
        result = self.pool.call_many([(self.env_id, op, args)])[0]
        if isinstance(result, EnvFailure):
            raise result
        return result

    def reset(self, seed: Optional[int] = None) -> Any:
        return self._call("reset", seed)

    def step(self, action: str) -> StepResult:
        return self._call("step", action)

    def render(self) -> str:
        return self._call("render")

    def close(self) -> None:
        if self.env_id not in self.pool._lost and self.pool.workers:
            self.pool.call_many([(self.env_id, "close", ())])


def step_many(envs: Sequence[TextEnv], actions: Sequence[str]) -> List[Any]:
    """Step several environments: remote ones of one pool in one round trip per process;
    each result is ``(obs, reward, done, info)`` or the exception it raised."""
    results: List[Any] = [None] * len(envs)
    remote = [i for i, env in enumerate(envs) if isinstance(env, RemoteEnv)]
    pools: Dict[int, List[int]] = {}
    for i in remote:
        pools.setdefault(id(envs[i].pool), []).append(i)
    for indices in pools.values():
        pool = envs[indices[0]].pool
        values = pool.call_many([(envs[i].env_id, "step", (actions[i],)) for i in indices])
        for i, value in zip(indices, values, strict=True):
            results[i] = value
    for i, env in enumerate(envs):
        if not isinstance(env, RemoteEnv):
            try:
                results[i] = env.step(actions[i])
            except Exception as exc:
                results[i] = exc
    return results
