"""``reach``: a 2D tabletop that needs no simulator, no download and little CPU.

A point gripper (dark disc) moves over a unit table by delta actions ``[dx, dy]`` in
[-1, 1] (times ``max_delta`` per action); four coloured blocks lie on it, and the gripper
shoves any block it runs into (blocks do not collide with each other: a toy, not physics).
Tasks: ``reach_<colour>`` (touch the block) and ``push_<colour>_<side>`` (shove the block
past the line at 0.2 / 0.8 on that side; the goal strip is shaded in the image). The
reward is sparse: 1.0 on the action that succeeds, which ends the episode. With
``reward_shaping=True`` (as robosuite's option of that name) each action also earns the
rise of a potential (:func:`potential`): minus the gripper's distance to its target
(the block, or the point behind the block from which a push goes its way) and, on a push
task, minus the block's distance to its goal line. An episode's rewards then sum to its
success plus how much nearer the end state is than the start, so failures differ.

Coordinates: x to the right, y up, both in [0, 1]; the image row 0 is the top (y = 1).
Everything is numpy, so one core runs well over a thousand actions a second, and
:func:`expert_action` solves every task closed-loop for demonstrations and tests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from siirl.environment.embodied.base import EmbodiedEnv, Observation, StepResult

COLORS: Dict[str, Tuple[int, int, int]] = {
    "red": (220, 50, 47), "green": (50, 160, 60), "blue": (40, 90, 220),
    "yellow": (230, 185, 20)}
_NAMES = list(COLORS)
DIRECTIONS: Dict[str, Tuple[float, float]] = {
    "left": (-1.0, 0.0), "right": (1.0, 0.0), "up": (0.0, 1.0), "down": (0.0, -1.0)}
_WORDS = {"left": "to the left", "right": "to the right", "up": "to the top",
          "down": "to the bottom"}
# task id -> (colour, push side or None for reach)
TASKS: Dict[str, Tuple[str, Optional[str]]] = {
    **{f"reach_{c}": (c, None) for c in _NAMES},
    "push_red_left": ("red", "left"), "push_green_right": ("green", "right"),
    "push_blue_up": ("blue", "up"), "push_yellow_down": ("yellow", "down")}

GRIPPER_R = 0.04
BLOCK_R = 0.05
CONTACT = GRIPPER_R + BLOCK_R
REACH_SLACK = 0.02  # touching, give or take: the gripper stops short of a block by design
GOAL_LINE = 0.2  # a pushed block succeeds past 0.2 from the chosen edge
_TABLE = (236, 230, 216)
_GOAL_SHADE = (200, 220, 200)
_GRIPPER = (35, 35, 35)


@dataclass
class ReachState:
    """Everything that changes in an episode (the expert plans on copies of it)."""

    gripper: np.ndarray  # [2]
    velocity: np.ndarray  # [2], the last move over max_delta
    blocks: np.ndarray  # [4, 2], in COLORS order
    steps: int = 0
    success: bool = False
    done: bool = False

    def copy(self) -> ReachState:
        return replace(self, gripper=self.gripper.copy(), velocity=self.velocity.copy(),
                       blocks=self.blocks.copy())


@dataclass(frozen=True)
class _Task:
    task_id: str
    target: int  # block index
    direction: Optional[np.ndarray]  # push direction, None for reach
    instruction: str


def _task(task_id: str) -> _Task:
    colour, side = TASKS[task_id]
    if side is None:
        return _Task(task_id, _NAMES.index(colour), None, f"reach the {colour} block")
    return _Task(task_id, _NAMES.index(colour), np.array(DIRECTIONS[side]),
                 f"push the {colour} block {_WORDS[side]}")


def _layout(task: _Task, rng: np.random.Generator) -> ReachState:
    """Seeded start: blocks and gripper at least 0.15 apart; a block to push starts
    0.2-0.55 short of its goal line, away from the walls, so the gripper fits behind it."""
    placed: List[np.ndarray] = []

    def free(point: np.ndarray) -> bool:
        return all(np.linalg.norm(point - p) >= 0.15 for p in placed)

    blocks = np.zeros((len(_NAMES), 2))
    order = [task.target] + [i for i in range(len(_NAMES)) if i != task.target]
    for index in order:
        for _ in range(1000):
            point = rng.uniform(0.1, 0.9, size=2)
            if index == task.target and task.direction is not None:
                axis = int(np.argmax(np.abs(task.direction)))
                ahead = float(task.direction[axis])  # +1: goal line at 0.8, -1: at 0.2
                start = 0.5 + ahead * rng.uniform(-0.25, 0.1)
                point[axis] = start
                point[1 - axis] = rng.uniform(0.2, 0.8)
            if free(point):
                break
        placed.append(point)
        blocks[index] = point
    for _ in range(1000):
        gripper = rng.uniform(0.1, 0.9, size=2)
        if free(gripper):
            break
    return ReachState(gripper=gripper, velocity=np.zeros(2), blocks=blocks)


def _short_of_line(block: np.ndarray, task: _Task) -> float:
    """How far a pushed ``block`` still is from its goal line (0 or less: past it)."""
    axis = int(np.argmax(np.abs(task.direction)))
    ahead = float(task.direction[axis])  # +1: goal line at 1 - GOAL_LINE, -1: at GOAL_LINE
    line = 1.0 - GOAL_LINE if ahead > 0 else GOAL_LINE
    return (line - float(block[axis])) * ahead


def _succeeded(state: ReachState, task: _Task) -> bool:
    block = state.blocks[task.target]
    if task.direction is None:
        return float(np.linalg.norm(state.gripper - block)) <= CONTACT + REACH_SLACK
    return _short_of_line(block, task) <= 0.0


def _behind(block: np.ndarray, task: _Task) -> np.ndarray:
    """Where the gripper pushes ``block`` from, in contact on the side away from its goal."""
    return block - task.direction * CONTACT


def potential(state: ReachState, task: _Task) -> float:
    """The shaping potential (0 at best, negative): minus the gripper's distance to where it
    should be, and on a push task minus the block's distance to its goal line too."""
    block = state.blocks[task.target]
    if task.direction is None:
        return -max(0.0, float(np.linalg.norm(state.gripper - block)) - CONTACT)
    remaining = max(0.0, _short_of_line(block, task))
    return -float(np.linalg.norm(state.gripper - _behind(block, task))) - remaining


def _advance(state: ReachState, task: _Task, action: np.ndarray, max_delta: float,
             max_steps: int, shaping: bool = False) -> float:
    """One action (already in [-1, 1]) on ``state`` in place; the reward (with
    ``shaping``, plus the potential's rise)."""
    if state.done:
        return 0.0
    before = potential(state, task) if shaping else 0.0
    start = state.gripper.copy()
    gripper = np.clip(start + action * max_delta, GRIPPER_R, 1.0 - GRIPPER_R)
    offset = state.blocks - gripper
    dist = np.linalg.norm(offset, axis=1)
    hit = dist < CONTACT
    if hit.any():
        # shove each touched block out along the contact normal (the move if dead centre)
        move = gripper - start
        fallback = move / (np.linalg.norm(move) or 1.0)
        normal = np.where(dist[:, None] > 1e-9, offset / np.maximum(dist, 1e-9)[:, None],
                          fallback)
        pushed = np.clip(gripper + normal * CONTACT, BLOCK_R, 1.0 - BLOCK_R)
        state.blocks = np.where(hit[:, None], pushed, state.blocks)
        # a block against a wall stops the gripper instead
        for i in np.flatnonzero(hit):
            gap = gripper - state.blocks[i]
            norm = float(np.linalg.norm(gap))
            if norm < CONTACT - 1e-9:
                gripper = state.blocks[i] + (gap / norm if norm > 1e-9 else -normal[i]) * CONTACT
        gripper = np.clip(gripper, GRIPPER_R, 1.0 - GRIPPER_R)
    state.velocity = (gripper - start) / max_delta
    state.gripper = gripper
    state.steps += 1
    shaped = potential(state, task) - before if shaping else 0.0
    if _succeeded(state, task):
        state.success = state.done = True
        return 1.0 + shaped
    state.done = state.steps >= max_steps
    return shaped


class Reach2D(EmbodiedEnv):
    """The ``reach`` task family (see the module docstring). ``tasks`` narrows
    ``task_ids`` (a curriculum or a held-out split); ``reward_shaping`` adds the
    potential's rise to each action's reward."""

    action_dim = 2

    def __init__(self, image_size: int = 64, max_steps: int = 50, max_delta: float = 0.06,
                 tasks: Optional[Sequence[str]] = None, reward_shaping: bool = False):
        unknown = sorted(set(tasks or ()) - set(TASKS))
        if unknown:
            raise ValueError(f"reach has no task {', '.join(map(repr, unknown))}; it has: "
                             f"{', '.join(TASKS)}")
        if int(image_size) < 16:
            raise ValueError(f"image_size must be at least 16, got {image_size}")
        self.task_ids = list(tasks) if tasks else list(TASKS)
        self.image_size = int(image_size)
        self.max_steps = int(max_steps)
        self.max_delta = float(max_delta)
        self.reward_shaping = bool(reward_shaping)
        self.task: Optional[_Task] = None
        self.state: Optional[ReachState] = None
        size = self.image_size
        self._centres = (np.arange(size) + 0.5) / size  # pixel centres, table units
        self._background: Optional[np.ndarray] = None

    # the episode -------------------------------------------------------------------

    def _reset(self, task_id: str, seed: int) -> Observation:
        self.task = _task(task_id)
        # the task's index joins the seed: reach_red and reach_blue get different tables
        index = list(TASKS).index(task_id)
        self.state = _layout(self.task, np.random.default_rng([seed, index]))
        self._background = self._table(self.task)
        return self._observe()

    def _step(self, chunk: np.ndarray) -> StepResult:
        if self.state is None:
            raise RuntimeError("reset() before step()")
        reward = 0.0
        for action in chunk:
            if self.state.done:
                break  # the rest of the chunk is dropped, as on a real robot at the goal
            reward += _advance(self.state, self.task, action.astype(np.float64),
                               self.max_delta, self.max_steps, self.reward_shaping)
        info = {"success": self.state.success, "steps": self.state.steps}
        return self._observe(), reward, self.state.done, info

    def _observe(self) -> Observation:
        state = self.state
        proprio = np.concatenate([state.gripper, state.velocity]).astype(np.float32)
        return {"image": self.render(), "proprio": proprio,
                "instruction": self.task.instruction}

    # drawing (numpy slices: a 64x64 frame costs a few microseconds) --------------------

    def _pixels(self, low: float, high: float, flip: bool) -> slice:
        size = self.image_size
        if flip:  # y up, rows down
            low, high = 1.0 - high, 1.0 - low
        return slice(max(0, int(round(low * size))), min(size, int(round(high * size))))

    def _table(self, task: _Task) -> np.ndarray:
        image = np.empty((self.image_size, self.image_size, 3), np.uint8)
        image[:] = _TABLE
        if task.direction is not None:
            axis = int(np.argmax(np.abs(task.direction)))
            low, high = ((1.0 - GOAL_LINE, 1.0) if task.direction[axis] > 0
                         else (0.0, GOAL_LINE))
            if axis == 0:
                image[:, self._pixels(low, high, False)] = _GOAL_SHADE
            else:
                image[self._pixels(low, high, True), :] = _GOAL_SHADE
        return image

    def render(self) -> np.ndarray:
        if self.state is None:
            raise RuntimeError("reset() before render()")
        image = self._background.copy()
        for index, (x, y) in enumerate(self.state.blocks):
            rows = self._pixels(y - BLOCK_R, y + BLOCK_R, True)
            cols = self._pixels(x - BLOCK_R, x + BLOCK_R, False)
            image[rows, cols] = COLORS[_NAMES[index]]
        x, y = self.state.gripper
        rows = self._pixels(y - GRIPPER_R, y + GRIPPER_R, True)
        cols = self._pixels(x - GRIPPER_R, x + GRIPPER_R, False)
        dy = (1.0 - self._centres[rows]) - y
        dx = self._centres[cols] - x
        disc = dy[:, None] ** 2 + dx[None, :] ** 2 <= GRIPPER_R ** 2
        image[rows, cols][disc] = _GRIPPER  # two slices: a view, so this writes the image
        return image


# the scripted expert ---------------------------------------------------------------------

def _toward(gripper: np.ndarray, point: np.ndarray, max_delta: float) -> np.ndarray:
    """The action that moves to ``point`` (exactly, when it is within one move)."""
    action = (point - gripper) / max_delta
    return action / max(1.0, float(np.max(np.abs(action))))


def _plan(state: ReachState, task: _Task, max_delta: float) -> np.ndarray:
    block = state.blocks[task.target]
    gripper = state.gripper
    if task.direction is None:
        return _toward(gripper, block, max_delta)  # contact counts, pushing it is harmless
    ahead = task.direction
    side = np.array([-ahead[1], ahead[0]])
    rel = gripper - block
    along, lateral = float(rel @ ahead), float(rel @ side)
    behind_point = block - ahead * (CONTACT + 0.01)
    if along <= -0.5 * CONTACT:  # on the back side: line up, then push through it
        if abs(lateral) < 0.03:  # off-centre pushes drift sideways; the term below steers
            action = ahead - side * lateral / max_delta
            return action / max(1.0, float(np.max(np.abs(action))))
        # re-centre a little further back, so the way there clears the block's corner
        return _toward(gripper, block - ahead * (CONTACT + 0.03), max_delta)
    # beside or in front: go round without touching it (sideways out, then back past it)
    toward_middle = 1.0 if float((0.5 - block) @ side) > 0 else -1.0
    sign = np.sign(lateral) if abs(lateral) > 1e-6 else toward_middle
    clear = CONTACT + 0.02
    if abs(lateral) < clear:
        return _toward(gripper, block + ahead * along + side * sign * (clear + 0.01), max_delta)
    return _toward(gripper, behind_point + side * sign * clear, max_delta)


def expert_action(env: Reach2D, noise: float = 0.0,
                  rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """The scripted expert's next action ``[2]`` for ``env``'s current state; ``noise``
    adds Gaussian noise of that standard deviation (clipped into [-1, 1])."""
    if env.state is None:
        raise RuntimeError("reset() the environment before asking the expert")
    action = _plan(env.state, env.task, env.max_delta)
    if noise > 0:
        rng = rng if rng is not None else np.random.default_rng()
        action = np.clip(action + rng.normal(0.0, noise, size=action.shape), -1.0, 1.0)
    return action.astype(np.float32)


def expert_chunk(env: Reach2D, k: int, noise: float = 0.0,
                 rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """The expert's next ``k`` actions ``[k, 2]``, planned open-loop on a copy of the state
    (zeros after the episode would end)."""
    if env.state is None:
        raise RuntimeError("reset() the environment before asking the expert")
    state = env.state.copy()
    chunk = np.zeros((int(k), env.action_dim), np.float32)
    for row in range(int(k)):
        if state.done:
            break
        action = _plan(state, env.task, env.max_delta)
        if noise > 0:
            rng = rng if rng is not None else np.random.default_rng()
            action = np.clip(action + rng.normal(0.0, noise, size=action.shape), -1.0, 1.0)
        chunk[row] = action
        _advance(state, env.task, chunk[row].astype(np.float64), env.max_delta,
                 env.max_steps)
    return chunk
