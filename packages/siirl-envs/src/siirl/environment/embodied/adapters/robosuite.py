"""``robosuite`` (extra ``siirl-envs[robosuite]``): robosuite 1.4's own single-arm tasks.

Task ids are robosuite environment names: ``Lift`` ("lift the red cube"), ``Stack``
("stack the red cube on the green cube"), ``Door``, ``NutAssemblySquare``,
``NutAssemblyRound``, ``NutAssembly``, ``PickPlaceCan`` / ``Milk`` / ``Bread`` /
``Cereal`` and ``PickPlace`` (see :data:`TASKS` for the wording). Lift and Stack are
tested; the others are built the same way. ``tasks`` narrows the list.

Settings: ``robot`` (``Panda``), ``camera`` (``agentview``; ``frontview``,
``birdview``, ``robot0_eye_in_hand`` also exist), ``image_size`` (128, square),
``max_steps`` (single actions per episode, 300), ``control_freq`` (20 Hz),
``reward_shaping`` (False: robosuite's sparse reward, 1.0 on success; True: its dense
staged reward), ``renderer`` (``osmesa`` or ``egl``, default ``MUJOCO_GL`` else osmesa).
The controller is robosuite's OSC_POSE: delta end-effector pose plus gripper, see
:class:`~siirl.environment.embodied.adapters.common.ArmEnv`. ``success`` is the task's
own ``_check_success()``; an episode ends on success or after ``max_steps`` actions.

The simulator is built at the first reset of a task (Lift: about 2-4 s on one CPU
core) and reused while the task stays the same: a reset is then about 0.1 s; with
OSMesa at 128x128 a step costs about 50 ms. Install::

    apt-get install libosmesa6            # rendering without a GPU
    pip install 'siirl-envs[robosuite]'   # robosuite 1.4.0, mujoco>=3,<3.4
    export MUJOCO_GL=osmesa               # optional: the default when unset
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from siirl.environment.embodied.adapters.common import ArmEnv, import_robosuite
from siirl.errors import ConfigError

EXTRA = "robosuite"
#: robosuite environment name -> the instruction the policy is given
TASKS: Dict[str, str] = {
    "Lift": "lift the red cube",
    "Stack": "stack the red cube on the green cube",
    "Door": "open the door",
    "NutAssemblySquare": "put the square nut on the square peg",
    "NutAssemblyRound": "put the round nut on the round peg",
    "NutAssembly": "put the square nut on the square peg and the round nut on the "
                   "round peg",
    "PickPlaceCan": "put the can into its bin",
    "PickPlaceMilk": "put the milk carton into its bin",
    "PickPlaceBread": "put the bread into its bin",
    "PickPlaceCereal": "put the cereal box into its bin",
    "PickPlace": "put the can, the milk carton, the bread and the cereal box each into "
                 "its bin",
}


class RobosuiteEnv(ArmEnv):
    """robosuite's tasks as an EmbodiedEnv (see the module docstring)."""

    def __init__(self, tasks: Optional[Sequence[str]] = None, robot: str = "Panda",
                 camera: str = "agentview", image_size: int = 128, max_steps: int = 300,
                 control_freq: float = 20.0, reward_shaping: bool = False,
                 renderer: Optional[str] = None, image_flip: str = "upright"):
        if isinstance(tasks, str):
            tasks = [tasks]
        unknown = sorted(set(tasks or ()) - set(TASKS))
        if unknown:
            raise ConfigError(f"robosuite: no task {', '.join(map(repr, unknown))}; the "
                              f"adapter plays: {', '.join(TASKS)}")
        super().__init__(camera, image_size, max_steps, image_flip)
        self.task_ids = list(tasks) if tasks else list(TASKS)
        self.robot = str(robot)
        self.control_freq = float(control_freq)
        self.reward_shaping = bool(reward_shaping)
        # imported now, so a missing package or renderer fails at build, not first reset
        self._suite = import_robosuite(EXTRA, EXTRA, renderer)

    def _build(self, task_id: str) -> Any:
        suite = self._suite
        controller = suite.load_controller_config(default_controller="OSC_POSE")
        env = suite.make(
            task_id, robots=self.robot, controller_configs=controller,
            has_renderer=False, has_offscreen_renderer=True,
            use_camera_obs=False,  # rendered once per chunk by _observe instead
            use_object_obs=True, reward_shaping=self.reward_shaping,
            control_freq=self.control_freq,
            # episodes are counted here; ignore_done keeps robosuite from refusing steps
            horizon=self.max_steps, ignore_done=True, hard_reset=False)
        if self.camera not in env.sim.model.camera_names:
            env.close()
            raise ConfigError(f"robosuite: {task_id} has no camera {self.camera!r}; it "
                              f"has: {', '.join(env.sim.model.camera_names)}")
        return env

    def _instruction(self, task_id: str) -> str:
        return TASKS[task_id]
