"""What the robosuite and LIBERO adapters share: renderer set-up, the robosuite import,
and :class:`ArmEnv`, a robosuite environment driven through the EmbodiedEnv API.

Rendering: MuJoCo renders offscreen through OSMesa (software, no GPU: ``apt-get install
libosmesa6``) or EGL (a GPU). ``renderer`` picks one; left out, ``MUJOCO_GL`` decides,
else OSMesa. robosuite picks its GL context once, when it is first imported, so the
choice is made (``MUJOCO_GL`` and ``PYOPENGL_PLATFORM`` set) before that import, and a
process that already imported robosuite with another one is an error rather than a
confusing crash in the first render.

Randomness: robosuite draws object placements and joint noise from the process-wide
``numpy.random``. Each environment keeps its own generator state and swaps it in around
every simulator call (:class:`~siirl.environment.adapters.PrivateRandom`), seeded from
``(seed, task)`` at reset: the same ``(task_id, seed)`` gives the same initial state
whatever else runs in the process. What the model itself draws when it is built (Lift's
cube size) is seeded by the task alone, so a rebuilt simulator is the same model: those
draws stay fixed per task, the per-episode ones (placements, joint noise) vary by seed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import importlib
import importlib.util
import logging
import os
import sys
import warnings
import zlib
from abc import abstractmethod
from typing import Any, Dict, Optional

import numpy as np

from siirl.environment.adapters import PrivateRandom
from siirl.environment.embodied.base import EmbodiedEnv, Observation, StepResult
from siirl.errors import ConfigError, PluginNotFoundError

RENDERERS = {"osmesa": "OSMesa", "egl": "EGL"}  # MUJOCO_GL value -> the library it loads
IMAGE_FLIPS = ("upright", "rot180", "none")
ROBOSUITE_VERSION = "1.4"


def _loadable(library: str) -> bool:
    path = ctypes.util.find_library(library)
    if path is None:
        return False
    try:
        ctypes.CDLL(path)
    except OSError:
        return False
    return True


def prepare_rendering(renderer: Optional[str], env_name: str, extra: str) -> str:
    """Choose the offscreen renderer before robosuite is imported; its name."""
    chosen = str(renderer or os.environ.get("MUJOCO_GL") or "osmesa").lower()
    if chosen not in RENDERERS:
        raise ConfigError(f"{env_name}: renderer={chosen!r} (or MUJOCO_GL) is not one of "
                          f"{', '.join(RENDERERS)}; osmesa needs no GPU")
    current = os.environ.get("MUJOCO_GL", "").lower()
    if "robosuite.utils.binding_utils" in sys.modules and current != chosen:
        raise ConfigError(f"{env_name}: robosuite is already imported in this process with "
                          f"MUJOCO_GL={current or 'unset'}, so renderer={chosen} cannot take "
                          "effect; set MUJOCO_GL before anything imports robosuite")
    if not _loadable(RENDERERS[chosen]):
        how = ("apt-get install libosmesa6 (software rendering, no GPU needed)"
               if chosen == "osmesa" else
               "an NVIDIA driver with EGL (libEGL.so), or renderer='osmesa' with "
               "apt-get install libosmesa6")
        raise PluginNotFoundError(f"environment '{env_name}' renders with {chosen}, but "
                                  f"lib{RENDERERS[chosen]} cannot be loaded: {how}")
    os.environ["MUJOCO_GL"] = chosen
    os.environ["PYOPENGL_PLATFORM"] = chosen
    return chosen


class _NoMacroNag(logging.Filter):
    """robosuite warns on every import that no private macro file exists; that file is
    for its demo scripts, so the warning says nothing to a siiRL user."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "macro" not in record.getMessage()


def import_robosuite(env_name: str, extra: str, renderer: Optional[str]) -> Any:
    """``import robosuite`` (1.4) with the renderer chosen first, or a clear error."""
    install = (f"pip install 'siirl-envs[{extra}]' (and apt-get install libosmesa6 to "
               "render without a GPU)")
    if importlib.util.find_spec("robosuite") is None:  # before the renderer: the first fix
        raise PluginNotFoundError(f"environment '{env_name}' needs robosuite "
                                  f"{ROBOSUITE_VERSION}: {install}")
    prepare_rendering(renderer, env_name, extra)
    logger = logging.getLogger("robosuite_logs")
    if not any(isinstance(f, _NoMacroNag) for f in logger.filters):
        logger.addFilter(_NoMacroNag())
    try:
        with warnings.catch_warnings():  # its import logs through the deprecated .warn
            warnings.filterwarnings("ignore", "The 'warn' method is deprecated",
                                    DeprecationWarning)
            robosuite = importlib.import_module("robosuite")
    except ImportError as exc:  # installed but broken (a missing undeclared dependency)
        raise PluginNotFoundError(f"environment '{env_name}' could not import robosuite "
                                  f"({exc}): {install}") from None
    version = str(getattr(robosuite, "__version__", "?"))
    if not version.startswith(ROBOSUITE_VERSION + "."):
        raise PluginNotFoundError(
            f"environment '{env_name}' needs robosuite {ROBOSUITE_VERSION}.x (its "
            f"controller API changed in 1.5), found {version}: pip install "
            f"'siirl-envs[{extra}]'")
    return robosuite


def flip_image(frame: np.ndarray, flip: str) -> np.ndarray:
    """MuJoCo's offscreen frame (OpenGL: row 0 is the bottom) in the asked orientation."""
    if flip == "upright":
        frame = frame[::-1]
    elif flip == "rot180":  # OpenVLA-style LIBERO datasets store frames turned 180 degrees
        frame = frame[::-1, ::-1]
    return np.ascontiguousarray(frame, dtype=np.uint8)


class ArmEnv(EmbodiedEnv):
    """A single-arm robosuite environment (OSC_POSE controller) as an EmbodiedEnv.

    Actions: 7 values, ``[dx, dy, dz, droll, dpitch, dyaw, gripper]``, each [-1, 1]
    mapped linearly onto the environment's ``action_spec`` (for OSC_POSE that is the
    identity: robosuite scales [-1, 1] to 5 cm and 0.5 rad per action; gripper -1 open,
    +1 closed). Proprio: end-effector position (3), quaternion (4, xyzw) and the two
    finger joints (2), float32. The image is rendered once per chunk, not per action.

    Subclasses build the simulator of a task (``_build``), start an episode
    (``_begin``) and word the task (``_instruction``); ``_limit`` is the task's own
    episode length (default ``max_steps``).
    """

    action_dim = 7

    def __init__(self, camera: str, image_size: int, max_steps: int,
                 image_flip: str = "upright"):
        if int(image_size) < 16:
            raise ConfigError(f"image_size must be at least 16, got {image_size}")
        if int(max_steps) < 1:
            raise ConfigError(f"max_steps must be at least 1, got {max_steps}")
        if image_flip not in IMAGE_FLIPS:
            raise ConfigError(f"image_flip={image_flip!r} is not one of "
                              f"{', '.join(IMAGE_FLIPS)}")
        self.camera = str(camera)
        self.image_size = int(image_size)
        self.max_steps = int(max_steps)
        self.image_flip = image_flip
        self._sim: Any = None  # the robosuite environment of _sim_task
        self._sim_task: Optional[str] = None
        self._random = PrivateRandom()
        self._task: Optional[str] = None
        self._raw: Dict[str, Any] = {}
        self._image: Optional[np.ndarray] = None
        self._steps, self._success, self._done = 0, False, False

    # hooks ------------------------------------------------------------------------------

    @abstractmethod
    def _build(self, task_id: str) -> Any:
        """A robosuite environment that can play ``task_id`` (offscreen renderer on)."""

    def _begin(self, task_id: str, seed: int) -> Dict[str, Any]:
        """Start an episode on ``self._sim`` (numpy.random already seeded); robosuite's
        observation dict."""
        return self._sim.reset()

    @abstractmethod
    def _instruction(self, task_id: str) -> str:
        """The English instruction of ``task_id``."""

    def _limit(self, task_id: str) -> int:
        return self.max_steps

    def _robot_env(self) -> Any:
        """The robosuite environment itself (a subclass may wrap it)."""
        return self._sim

    def _check_success(self) -> bool:
        return bool(self._robot_env()._check_success())

    # the episode ------------------------------------------------------------------------

    def _reset(self, task_id: str, seed: int) -> Observation:
        key = zlib.crc32(task_id.encode())  # stable whatever tasks the env was given
        self._task = None  # until this reset has succeeded
        with self._random.active():
            if self._sim_task != task_id:
                self._close_sim()
                # the model draws too (Lift's cube size): the same model on every build
                np.random.seed([key])
                self._sim = self._build(task_id)
                self._sim_task = task_id
            # seeded after any build, so a fresh and a reused simulator start alike
            np.random.seed([seed % 2 ** 32, key])
            self._raw = self._begin(task_id, seed)
        self._task = task_id
        self._steps, self._done = 0, False
        self._success = self._check_success()
        return self._observe()

    def _step(self, chunk: np.ndarray) -> StepResult:
        if self._task is None:
            raise RuntimeError("reset() before step()")
        low, high = (np.asarray(b, dtype=np.float64) for b in self._robot_env().action_spec)
        limit = self._limit(self._task)
        reward = 0.0
        for action in chunk:
            if self._done:
                break  # the rest of the chunk is dropped once the episode has ended
            command = low + (action.astype(np.float64) + 1.0) * 0.5 * (high - low)
            with self._random.active():
                self._raw, step_reward, _, _ = self._sim.step(command)
            self._steps += 1
            reward += float(step_reward)
            self._success = self._check_success()
            self._done = self._success or self._steps >= limit
        info = {"success": self._success, "steps": self._steps}
        return self._observe(), reward, self._done, info

    def _observe(self) -> Observation:
        size = self.image_size
        frame = self._robot_env().sim.render(camera_name=self.camera, width=size,
                                             height=size)
        self._image = flip_image(frame, self.image_flip)
        raw = self._raw
        proprio = np.concatenate([raw["robot0_eef_pos"], raw["robot0_eef_quat"],
                                  raw["robot0_gripper_qpos"]]).astype(np.float32)
        return {"image": self._image.copy(), "proprio": proprio,
                "instruction": self._instruction(self._task)}

    def render(self) -> np.ndarray:
        if self._image is None:
            raise RuntimeError("reset() before render()")
        return self._image.copy()

    @property
    def suite_env(self) -> Any:
        """The simulator's own environment object (None before the first reset)."""
        return self._sim

    def _close_sim(self) -> None:
        sim, self._sim, self._sim_task = self._sim, None, None
        if sim is None:
            return
        # free the GL context now, in order: left to interpreter shutdown, its __del__
        # runs after OpenGL's own modules are gone and prints an error
        sim.close()
        del sim
        gc.collect()

    def close(self) -> None:
        self._close_sim()
        self._task, self._image = None, None
