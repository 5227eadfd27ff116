"""FrozenLake (``env_type: frozen_lake``, extra ``siirl-envs[gym]``): gymnasium's
``FrozenLake-v1`` on a random map made from the episode's seed, in text.

Grid symbols: ``P`` you, ``_`` frozen ice, ``O`` hole, ``G`` goal. Actions: Left, Down,
Right, Up. Reward 1 for reaching the goal; the episode ends there or in a hole.
gymnasium's ``generate_random_map`` only returns maps with a path from start to goal.

``progress_reward: c`` (not slippery only) adds ``c`` for each step that shortens the safe
path left to the goal and takes ``c`` off for each that lengthens it (a bump into the edge:
nothing; a fall into a hole: nothing, the episode just ends), so every move is scored, not
only the last one: shaping by the path length, which leaves the best policy unchanged.
"""

from __future__ import annotations

from collections import deque
from typing import List, Optional

from siirl.environment.base import StepResult, TextEnv
from siirl.errors import ConfigError, PluginNotFoundError

ACTIONS = {"left": 0, "down": 1, "right": 2, "up": 3}
_DELTAS = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}


def _gymnasium():
    try:
        import gymnasium
        from gymnasium.envs.toy_text.frozen_lake import generate_random_map
    except ImportError as exc:
        raise PluginNotFoundError(
            f"environment 'frozen_lake' needs gymnasium ({exc}): pip install "
            "\"siirl-envs[gym]\"") from None
    return gymnasium, generate_random_map


class FrozenLake(TextEnv):
    instructions = (
        "You are walking on a frozen lake. Reach the goal (G) without falling into a hole "
        "(O). Symbols: P you, _ frozen ice, O hole, G goal. Actions: Left, Down, Right, Up. "
        "Reply with one action inside <answer></answer>, e.g. <answer>Down</answer>.")

    def __init__(self, size: int = 4, p: float = 0.8, is_slippery: bool = False,
                 max_steps: Optional[int] = None, progress_reward: float = 0.0):
        if int(size) < 2:
            raise ConfigError(f"frozen_lake: size={size} must be at least 2")
        if not 0.0 < float(p) <= 1.0:
            raise ConfigError(f"frozen_lake: p={p} (the chance a cell is frozen) must be in "
                              "(0, 1]")
        if float(progress_reward) and is_slippery:
            raise ConfigError("frozen_lake: progress_reward needs is_slippery=false (a "
                              "slippery step does not go where it was sent)")
        self.size, self.p, self.is_slippery = int(size), float(p), bool(is_slippery)
        self.progress_reward = float(progress_reward)
        self._left: Optional[int] = None
        self.max_steps = max_steps
        self._gym = None
        self.desc: List[str] = []
        self.steps = 0

    def reset(self, seed: Optional[int] = None) -> str:
        gymnasium, generate_random_map = _gymnasium()
        self.close()
        self.desc = generate_random_map(size=self.size, p=self.p, seed=seed)
        self._gym = gymnasium.make("FrozenLake-v1", desc=self.desc,
                                   is_slippery=self.is_slippery)
        self._gym.reset(seed=seed)
        self.steps = 0
        self._left: Optional[int] = None  # the cached _path_left()
        return self.render()

    @property
    def position(self) -> tuple:
        state = int(self._gym.unwrapped.s)
        return divmod(state, self.size)

    def step(self, action: str) -> StepResult:
        if self._gym is None:
            raise RuntimeError("frozen_lake: step() before reset()")
        code = ACTIONS.get(str(action).strip().lower())
        self.steps += 1
        if code is None:  # not an action: nothing moves
            done = self.max_steps is not None and self.steps >= self.max_steps
            return self.render(), 0.0, done, {"success": False, "action_is_valid": False}
        before = self._path_left() if self.progress_reward else None
        _, reward, terminated, truncated, _ = self._gym.step(code)
        self._left = None  # the position moved
        success = reward > 0
        if before is not None and not (terminated and not success):
            reward += self.progress_reward * (before - self._path_left())
        done = bool(terminated or truncated) or \
            (self.max_steps is not None and self.steps >= self.max_steps)
        return self.render(), float(reward), done, {"success": success,
                                                    "action_is_valid": True}

    def _path_left(self) -> int:
        """Moves on the shortest safe path from here to the goal (0 on it); searched once
        per position, as the last step's result is the next step's start."""
        if self._left is None:
            path = solve(self)
            self._left = len(path) if path is not None else 0
        return self._left

    def render(self) -> str:
        if self._gym is None:
            return ""
        row_at, col_at = self.position
        symbols = {"S": "_", "F": "_", "H": "O", "G": "G"}
        return "\n".join("".join("P" if (r, c) == (row_at, col_at) else symbols[ch]
                                 for c, ch in enumerate(line))
                         for r, line in enumerate(self.desc))

    def close(self) -> None:
        if self._gym is not None:
            self._gym.close()
            self._gym = None


def solve(env: FrozenLake) -> Optional[List[str]]:
    """A shortest safe action list from the current position to the goal (not slippery)."""
    names = {code: name.capitalize() for name, code in ACTIONS.items()}
    start = env.position
    seen, queue = {start}, deque([(start, [])])
    while queue:
        (r, c), path = queue.popleft()
        if env.desc[r][c] == "G":
            return path
        for code, (dr, dc) in _DELTAS.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < env.size and 0 <= nc < env.size and env.desc[nr][nc] != "H" \
                    and (nr, nc) not in seen:
                seen.add((nr, nc))
                queue.append(((nr, nc), path + [names[code]]))
    return None
