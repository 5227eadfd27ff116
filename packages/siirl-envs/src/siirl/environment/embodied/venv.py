"""N embodied environments in N processes, stepped as one batch.

Each environment gets a process of its own, so a simulator that hangs or dies costs only
its own episode: every call is sent to all processes first, then the answers are collected
against one deadline (``step_timeout_s``). A process that misses it is killed, one whose
pipe breaks (segfault, ``os._exit``) is reaped; either is restarted at once and its
episode ends as ``done=True, reward=0, info["error"]="timeout"|"crash"``, counted in
``errors``. An environment that raises ends its episode as ``"step"``; it keeps its
process. A lost episode stays ended (``step`` answers it without a call) until ``reset``.

The processes are the shared environment process pool's
(:mod:`siirl.environment.episodes.pool`: deadlines, restarts, ``forkserver``, and why not
gymnasium's ``AsyncVectorEnv``), one environment each, built by its factory when the
process starts. Environment factories must therefore be picklable (a class, a
module-level function, a ``functools.partial`` of one), or given as a registered name and
its config.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from siirl.environment.embodied.base import EmbodiedEnv, stack_observations
from siirl.environment.embodied.registry import embodied_env_class, make_embodied_env
from siirl.environment.episodes.pool import FAILURES, EnvProcessPool

EnvFactory = Callable[[], EmbodiedEnv]
FAILURE_KINDS = ("timeout", "crash", "step")
_SPEC = ("task_ids", "action_dim", "max_steps")


class EmbodiedEnvError(RuntimeError):
    """A remote environment call failed beyond recovery; ``kind`` says how."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class VectorEmbodiedEnv:
    """``num_envs`` environments in subprocesses, reset and stepped as a batch.

    ``env_fns``: one picklable factory per environment, or a registered name (then
    ``num_envs`` and ``config`` say how many and with what settings)::

        venv = VectorEmbodiedEnv("reach", num_envs=8, config={"image_size": 64})
        obs = venv.reset(["reach_red"] * 8, seeds=range(8))
        obs, rewards, dones, infos = venv.step(actions)   # [8, k, action_dim]
    """

    def __init__(self, env_fns: Union[str, Sequence[EnvFactory]],
                 num_envs: Optional[int] = None, step_timeout_s: float = 30.0, *,
                 config: Optional[Mapping[str, Any]] = None, start_timeout_s: float = 120.0,
                 start_method: str = "forkserver"):
        if isinstance(env_fns, str):
            if num_envs is None:
                raise ValueError("a named environment needs num_envs")
            embodied_env_class(env_fns)  # an unknown name fails here, before any process
            factories = [functools.partial(make_embodied_env, env_fns, dict(config or {}))
                         ] * int(num_envs)
        else:
            factories = list(env_fns)
            if num_envs is not None and int(num_envs) != len(factories):
                raise ValueError(f"num_envs={num_envs} but {len(factories)} env_fns")
        if not factories:
            raise ValueError("a vector of no environments")
        self.step_timeout_s = float(step_timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.errors: Dict[str, int] = {kind: 0 for kind in FAILURE_KINDS}
        self.clipped = 0  # action values clipped into range, over all steps
        self._factories = factories
        self._pool: Optional[EnvProcessPool] = None
        self._last_obs: List[Optional[Dict[str, Any]]] = [None] * len(factories)
        self._lost: List[Optional[str]] = [None] * len(factories)  # until the next reset
        try:
            self._pool = EnvProcessPool(factories, self.step_timeout_s, self.start_timeout_s,
                                        start_method)
            specs = self._exchange(list(range(len(factories))), "attrs",
                                   [(_SPEC,)] * len(factories))
        except BaseException:
            self.close()
            raise
        for i, (status, value) in enumerate(specs):
            if status != "ok":
                self.close()
                why = {"timeout": f"no answer within start_timeout_s={self.start_timeout_s:g}",
                       "crash": "its process died while starting (can a fresh process "
                                "import the factory and its module?)"}.get(status, value)
                raise EmbodiedEnvError(status, f"environment {i} did not start: {why}")
        task_ids, action_dim, max_steps = specs[0][1]
        self.task_ids, self.action_dim = list(task_ids), int(action_dim)
        self.max_steps = int(max_steps)

    @property
    def num_envs(self) -> int:
        return len(self._factories)

    @property
    def pids(self) -> List[int]:
        """The worker processes' ids, in environment order (they change on a restart)."""
        return self._pool.pids if self._pool is not None else []

    # the batch calls ---------------------------------------------------------------------

    def reset(self, task_ids: Union[str, Sequence[str]], seeds: Sequence[int],
              env_ids: Optional[Sequence[int]] = None) -> Dict[str, Any]:
        """Start episodes in ``env_ids`` (default: all); a batch of observations (see
        :func:`stack_observations`). A process lost during reset is restarted and asked
        once more; an environment that raises (say, an unknown task id) raises here."""
        env_ids = self._ids(env_ids)
        if isinstance(task_ids, str):
            task_ids = [task_ids] * len(env_ids)
        seeds = [int(s) for s in seeds]
        if not len(task_ids) == len(seeds) == len(env_ids):
            raise ValueError(f"{len(env_ids)} environments, {len(task_ids)} task ids, "
                             f"{len(seeds)} seeds")
        args = [(t, s) for t, s in zip(task_ids, seeds, strict=True)]
        replies = self._exchange(env_ids, "reset", args)
        retry = [j for j, (status, _) in enumerate(replies) if status in ("timeout", "crash")]
        if retry:
            again = self._exchange([env_ids[j] for j in retry], "reset",
                                   [args[j] for j in retry])
            for j, reply in zip(retry, again, strict=True):
                replies[j] = reply
        for j, (status, value) in enumerate(replies):
            if status != "ok":
                raise EmbodiedEnvError(status, f"environment {env_ids[j]} could not reset "
                                       f"{args[j]}: {value}")
        for i, (_, obs) in zip(env_ids, replies, strict=True):
            self._last_obs[i], self._lost[i] = obs, None
        return stack_observations([obs for _, obs in replies])

    def step(self, actions: Any, env_ids: Optional[Sequence[int]] = None
             ) -> Tuple[Dict[str, Any], np.ndarray, np.ndarray, List[Dict[str, Any]]]:
        """Step ``env_ids`` (default: all) with ``actions`` ``[n, k, action_dim]`` (or
        ``[n, action_dim]``, chunks of one); ``(obs, rewards [n], dones [n], infos)``."""
        env_ids = self._ids(env_ids)
        actions = np.asarray(actions, dtype=np.float32)
        if actions.ndim == 2:
            actions = actions[:, None, :]
        if actions.ndim != 3 or actions.shape[0] != len(env_ids) \
                or actions.shape[2] != self.action_dim:
            raise ValueError(f"actions must be [{len(env_ids)}, k, {self.action_dim}]; "
                             f"got {actions.shape}")
        never = [i for i in env_ids if self._last_obs[i] is None]
        if never:
            raise RuntimeError(f"reset environments {never} before stepping them")
        live = [j for j, i in enumerate(env_ids) if self._lost[i] is None]
        replies = dict(zip(live, self._exchange([env_ids[j] for j in live], "step",
                                                [(actions[j],) for j in live]),
                           strict=True))
        results = []
        for j, i in enumerate(env_ids):
            status, value = replies.get(j, (None, None))
            if status == "ok":
                obs, reward, done, info = value
                self._last_obs[i] = obs
                self.clipped += int(info.get("clipped", 0))
                results.append((obs, float(reward), bool(done), info))
                continue
            if status == "error":  # the environment raised: only its episode ends
                self.errors["step"] += 1
                self._lost[i] = "step"
            info = {"success": False, "clipped": 0, "error": self._lost[i]}
            if status == "error":
                info["message"] = value
            results.append((self._last_obs[i], 0.0, True, info))
        obs = stack_observations([r[0] for r in results])
        rewards = np.array([r[1] for r in results], dtype=np.float32)
        dones = np.array([r[2] for r in results], dtype=bool)
        return obs, rewards, dones, [r[3] for r in results]

    def render(self, env_ids: Optional[Sequence[int]] = None) -> List[Optional[np.ndarray]]:
        """Each environment's camera image (None where its process was just lost)."""
        env_ids = self._ids(env_ids)
        replies = self._exchange(env_ids, "render", [()] * len(env_ids))
        return [value if status == "ok" else None for status, value in replies]

    # processes -------------------------------------------------------------------------

    def _ids(self, env_ids: Optional[Sequence[int]]) -> List[int]:
        if self._pool is None or not self._pool.processes:
            raise RuntimeError("this VectorEmbodiedEnv is closed")
        ids = list(range(self.num_envs)) if env_ids is None else [int(i) for i in env_ids]
        if len(set(ids)) != len(ids) or any(not 0 <= i < self.num_envs for i in ids):
            raise ValueError(f"env_ids must be distinct, in [0, {self.num_envs}): {ids}")
        return ids

    def _exchange(self, env_ids: List[int], op: str, args: List[tuple]
                  ) -> List[Tuple[str, Any]]:
        """One call per environment (its process's object 0), all at once against the
        deadline; ``(status, value)`` per call, status ok, error (the env raised; value its
        message), timeout or crash (process restarted, the episode lost and counted)."""
        replies = self._pool.call_many([(i, 0, op, call_args) for i, call_args
                                        in zip(env_ids, args, strict=True)])
        out = []
        for i, (status, value) in zip(env_ids, replies, strict=True):
            if status in FAILURES:
                self.errors[status] += 1
                self._lost[i] = status
            out.append((status, value[0] if status == "error" else value))
        return out

    def close(self) -> None:
        """Stop every process (politely, then by force) and reap it; safe to repeat."""
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> VectorEmbodiedEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
