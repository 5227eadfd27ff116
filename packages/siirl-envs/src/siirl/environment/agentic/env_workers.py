"""Text environments in worker processes (``env_manager.env_processes`` > 0), so one that
hangs, crashes or is slow cannot stall or take down the training worker.

The shared environment process pool (:mod:`siirl.environment.episodes.pool`) hosts the
episodes' environments (spread round-robin); each turn the env manager sends every process
all of its environments' actions at once and waits at most ``env_manager.step_timeout_s``
for the answers. A process that misses the deadline is killed (its environments' episodes
end as ``timeout``), one that dies (a segfault, an ``os._exit``) ends its episodes as
``crash``; either way it is restarted for the next calls. An environment that raises ends
only its own episode (``step``), as in-process.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from siirl.environment.base import StepResult, TextEnv
from siirl.environment.episodes.pool import FAILURES, EnvProcessPool
from siirl.environment.registry import make_env

START_TIMEOUT_S = 120.0


class EnvFailure(RuntimeError):
    """A remote environment call failed; ``kind`` is timeout, crash or step."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _build(env_type: Any, settings: Any, instructions: Optional[str] = None) -> TextEnv:
    """A registered name, or a TextEnv class itself (importable by its module path)."""
    env = env_type(**dict(settings or {})) if isinstance(env_type, type) else \
        make_env(env_type, settings)
    if instructions is not None:
        env.instructions = instructions
    return env


class EnvWorkerPool:
    def __init__(self, processes: int, step_timeout_s: float):
        self.step_timeout_s = float(step_timeout_s)
        self.processes = EnvProcessPool([None] * int(processes), step_timeout_s,
                                        START_TIMEOUT_S)
        self._home: Dict[int, int] = {}  # env id -> process index
        self._lost: Dict[int, str] = {}  # env id -> why its process went away
        self._next = 0

    @property
    def workers(self) -> List[Any]:
        return self.processes.processes

    def create(self, env_type: Any, settings: Any, instructions: Optional[str]) -> RemoteEnv:
        env_id = self._next
        self._next += 1
        self._home[env_id] = env_id % len(self.workers)
        local = _build(env_type, settings, instructions)  # instructions and parsing only
        # a process's first call waits for its start-up (imports): a longer deadline
        created = self.call_many([(env_id, "create", (_build, (env_type, dict(settings or {}),
                                                               instructions)))],
                                 timeout_s=max(START_TIMEOUT_S, self.step_timeout_s))[0]
        if isinstance(created, EnvFailure):
            raise created
        return RemoteEnv(self, env_id, local)

    def call_many(self, calls: Sequence[Tuple[int, str, tuple]],
                  timeout_s: Optional[float] = None) -> List[Any]:
        """Run ``(env id, op, args)`` calls, all processes at once, within ``timeout_s``
        (default ``step_timeout_s``); each result is the value or an :class:`EnvFailure`."""
        results: List[Any] = [None] * len(calls)
        sent = []
        for index, (env_id, _, _) in enumerate(calls):
            if env_id in self._lost:
                results[index] = EnvFailure(self._lost[env_id], "its environment process "
                                            f"was lost earlier ({self._lost[env_id]})")
            else:
                sent.append(index)
        replies = self.processes.call_many(
            [(self._home[calls[i][0]], calls[i][0], calls[i][1], calls[i][2]) for i in sent],
            timeout_s)
        for i, (status, value) in zip(sent, replies, strict=True):
            if status in FAILURES:
                self._process_lost(self._home[calls[i][0]], status)
                results[i] = EnvFailure(status, (
                    f"no answer within env_manager.step_timeout_s={self.step_timeout_s:g}"
                    if status == "timeout" else "its environment process died"))
            else:
                results[i] = value if status == "ok" else EnvFailure(
                    "step", f"{value[0]} [{value[1]}]")
        return results

    def _process_lost(self, process: int, kind: str) -> None:
        """The pool restarted a process: every environment it hosted is lost."""
        for env_id, home in self._home.items():
            if home == process:
                self._lost.setdefault(env_id, kind)

    def close(self) -> None:
        self.processes.close()


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
