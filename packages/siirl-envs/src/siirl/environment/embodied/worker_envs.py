"""A training worker's embodied environments, built from ``actor_rollout_ref.embodied.env``
and kept for the run: ``num_envs`` processes (:class:`VectorEmbodiedEnv`, a hung or crashed
simulator restarted, its episode dropped and counted), or with ``num_envs=0`` plain objects
in the worker's process (a numpy task needs no process)."""

from __future__ import annotations

import atexit
import inspect
from typing import Any, Dict, List, Sequence

import numpy as np

from siirl.environment.embodied.base import EmbodiedEnv, stack_observations
from siirl.environment.embodied.registry import embodied_env_class, make_embodied_env
from siirl.environment.embodied.venv import VectorEmbodiedEnv

EMBODIED = "actor_rollout_ref.embodied"


def env_spec(config: Any) -> tuple:
    """``(name, settings)`` of the environment ``actor_rollout_ref.embodied.env`` asks for:
    ``env_type`` names it, ``env_config`` holds its own settings, and siiRL's ``max_steps``,
    ``env_name`` (a LIBERO suite, or task ids) and ``num_steps_wait`` fill what it takes."""
    env = config.actor_rollout_ref.embodied.env
    name = str(env.env_type)
    settings = dict(env.env_config or {})
    cls = embodied_env_class(name, f"{EMBODIED}.env.env_type")
    try:
        accepted = set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        accepted = set()
    if "max_steps" in accepted:
        settings.setdefault("max_steps", int(env.max_steps))
    env_name = str(env.env_name or "")
    if name == "libero" and env_name:
        settings.setdefault("suites", [env_name])
    elif env_name and env_name not in ("all", "libero_10") and "tasks" in accepted:
        settings.setdefault("tasks", [t for t in env_name.split(",") if t])
    if "settle_steps" in accepted:
        settings.setdefault("settle_steps", int(env.num_steps_wait))
    return name, settings


class LocalEnvs:
    """Environments in this process, with :class:`VectorEmbodiedEnv`'s batch calls
    (``actor_rollout_ref.embodied.env.num_envs=0``: a pure-numpy task needs no process)."""

    def __init__(self, name: str, settings: Dict[str, Any], count: int):
        self.envs: List[EmbodiedEnv] = [make_embodied_env(name, settings)
                                        for _ in range(max(1, count))]
        first = self.envs[0]
        self.task_ids, self.action_dim = list(first.task_ids), first.action_dim
        self.max_steps = first.max_steps
        self.errors = {"timeout": 0, "crash": 0, "step": 0}
        self.clipped = 0
        self._spec = (name, settings)

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def grow(self, count: int) -> None:
        while len(self.envs) < count:
            self.envs.append(make_embodied_env(*self._spec))

    def reset(self, task_ids: Sequence[str], seeds: Sequence[int], env_ids: Sequence[int]):
        return stack_observations([self.envs[i].reset(t, s)
                                   for i, t, s in zip(env_ids, task_ids, seeds, strict=True)])

    def step(self, actions: np.ndarray, env_ids: Sequence[int]):
        results = [self.envs[i].step(a) for i, a in zip(env_ids, actions, strict=True)]
        self.clipped += sum(int(r[3].get("clipped", 0)) for r in results)
        return (stack_observations([r[0] for r in results]),
                np.array([r[1] for r in results], np.float32),
                np.array([r[2] for r in results], bool), [r[3] for r in results])

    def close(self) -> None:
        for env in self.envs:
            env.close()


_ENVS: Dict[tuple, Any] = {}  # this worker's environments, kept for the run


def worker_envs(config: Any, episodes: int) -> Any:
    env = config.actor_rollout_ref.embodied.env
    name, settings = env_spec(config)
    processes = int(env.num_envs or 0)
    timeout = float(env.step_timeout_s or 60.0)
    key = (name, repr(sorted(settings.items())), processes, timeout)
    if key not in _ENVS:
        _ENVS[key] = VectorEmbodiedEnv(name, processes, timeout, config=settings) \
            if processes > 0 else LocalEnvs(name, settings, episodes)
        atexit.register(_ENVS[key].close)
    envs = _ENVS[key]
    if isinstance(envs, LocalEnvs):
        envs.grow(episodes)
    return envs
