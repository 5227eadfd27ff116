"""The embodied environment API: a robot (or a simulated one) driven by action chunks.

An episode: ``reset(task_id, seed)`` gives the first observation, a dict of ``image``
(uint8, H x W x 3), ``proprio`` (float32 vector: the robot's own state) and ``instruction``
(the task in English); each ``step(chunk)`` executes a chunk of ``k`` actions (a VLA
policy emits several per forward pass) and gives ``(obs, reward, done, info)`` with
``info["success"]`` and ``info["clipped"]``. ``max_steps`` counts single actions, so an
episode lasts at most ``ceil(max_steps / k)`` chunks whatever ``k`` the policy uses.

Actions live in [-1, 1]. A policy's sample can leave that box (a Gaussian head, a
de-tokenised bin off by one): the value is clipped and counted, never an exception, so
one bad sample costs at most a clumsy move, and the count shows up in the metrics.
The same ``(task_id, seed)``, the same initial state, so a GRPO group starts together.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

Observation = Dict[str, Any]  # {"image": uint8 HxWx3, "proprio": float32 [P], "instruction": str}
StepResult = Tuple[Observation, float, bool, Dict[str, Any]]


def clip_actions(chunk: Any, action_dim: int) -> Tuple[np.ndarray, int]:
    """``chunk`` as float32 ``[k, action_dim]`` inside [-1, 1], and how many values had to
    be changed (NaN counts, and becomes 0). A single action ``[action_dim]`` is a chunk of
    one. A wrong shape is a caller's bug, so that one raises."""
    array = np.asarray(chunk, dtype=np.float32)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] != action_dim or array.shape[0] == 0:
        raise ValueError(f"an action chunk is [k, {action_dim}] with k >= 1; got shape "
                         f"{np.shape(chunk)}")
    inside = (array >= -1.0) & (array <= 1.0)  # False for NaN too
    clipped = int(array.size - np.count_nonzero(inside))
    if clipped:
        array = np.clip(np.nan_to_num(array, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
    return array, clipped


def check_observation(obs: Mapping[str, Any]) -> None:
    """Raise ValueError unless ``obs`` follows the observation convention (tests,
    adapters' self-checks)."""
    image, proprio = obs.get("image"), obs.get("proprio")
    if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3
            and image.shape[2] == 3):
        got = f"{getattr(image, 'dtype', type(image).__name__)} {getattr(image, 'shape', '')}"
        raise ValueError(f"obs['image'] must be uint8 HxWx3, got {got}")
    if not (isinstance(proprio, np.ndarray) and proprio.dtype == np.float32
            and proprio.ndim == 1):
        raise ValueError("obs['proprio'] must be a float32 vector")
    if not isinstance(obs.get("instruction"), str):
        raise ValueError("obs['instruction'] must be a str")


def stack_observations(observations: Sequence[Observation]) -> Dict[str, Any]:
    """A batch: ``image`` [N, H, W, 3], ``proprio`` [N, P], ``instruction`` list of N."""
    return {"image": np.stack([o["image"] for o in observations]),
            "proprio": np.stack([o["proprio"] for o in observations]),
            "instruction": [o["instruction"] for o in observations]}


class EmbodiedEnv(ABC):
    """Base class of embodied environments. Subclasses implement ``_reset`` and ``_step``
    (which get a valid task id and an already clipped chunk) and ``render``."""

    #: the tasks this environment can play, e.g. ``["reach_red", "push_green_left"]``
    task_ids: List[str] = []
    action_dim: int = 0
    #: the longest episode, in single actions (chunk rows)
    max_steps: int = 0

    def reset(self, task_id: str, seed: int = 0) -> Observation:
        """Start an episode of ``task_id``; the same seed, the same initial state."""
        if task_id not in self.task_ids:
            raise ValueError(f"unknown task id {task_id!r}; this environment has: "
                             f"{', '.join(self.task_ids)}")
        return self._reset(task_id, int(seed))

    def step(self, action_chunk: Any) -> StepResult:
        """Execute a chunk ``[k, action_dim]`` (values clipped into [-1, 1] and counted);
        ``(obs, reward, done, info)``, ``info`` with ``success`` and ``clipped``."""
        chunk, clipped = clip_actions(action_chunk, self.action_dim)
        obs, reward, done, info = self._step(chunk)
        info = dict(info)
        info.setdefault("success", False)
        info["clipped"] = clipped
        return obs, float(reward), bool(done), info

    @abstractmethod
    def _reset(self, task_id: str, seed: int) -> Observation:
        """Set up the episode; the first observation."""

    @abstractmethod
    def _step(self, chunk: np.ndarray) -> StepResult:
        """Execute the rows of ``chunk`` in order, stopping early when the episode ends."""

    @abstractmethod
    def render(self) -> np.ndarray:
        """The current camera image, uint8 H x W x 3 (video capture)."""

    def close(self) -> None:  # noqa: B027 - optional: a pure-numpy task holds nothing
        """Release what the environment holds (simulator, renderer, GPU context)."""

    def __enter__(self) -> EmbodiedEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
