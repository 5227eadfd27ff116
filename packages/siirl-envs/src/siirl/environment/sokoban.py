"""Sokoban (``env_type: sokoban``): push every box onto a target, generated puzzles that are
solvable by construction.

A puzzle is made from its seed: a room carved by a random walk inside walls, boxes placed
on their targets, then the player walks backwards ``search_depth`` moves, pulling boxes as it
goes. Replaying the pulls as pushes solves it, so every puzzle has a solution.

Grid symbols: ``#`` wall, ``_`` floor, ``O`` target, ``X`` box, ``*`` box on a target, ``P``
player, ``S`` player on a target. Actions: Up, Down, Left, Right. Rewards (as ROLL's
Sokoban): -0.1 per step, +1 for a box pushed onto a target, -1 for one pushed off, +10 when
every box is on a target (the episode then ends). ``progress_reward: c`` adds ``c`` for each
move that shortens the shortest solution left and takes ``c`` off for each that lengthens
it (none once the puzzle can no longer be solved): shaping that scores every move.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

from siirl.environment.base import StepResult, TextEnv
from siirl.errors import ConfigError

Cell = Tuple[int, int]
MOVES: Dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
STEP_REWARD, BOX_ON, BOX_OFF, SOLVED = -0.1, 1.0, -1.0, 10.0
_UNKNOWN = object()  # a solution length not searched for yet


def _add(a: Cell, b: Cell) -> Cell:
    return a[0] + b[0], a[1] + b[1]


class Sokoban(TextEnv):
    instructions = (
        "You are solving Sokoban. Push every box (X) onto a target (O). Symbols: # wall, "
        "_ floor, O target, X box, * box on target, P you, S you on a target. You push a "
        "box by walking into it; you cannot pull. Actions: Up, Down, Left, Right. Reply "
        "with one action inside <answer></answer>, e.g. <answer>Left</answer>.")

    def __init__(self, dim_room: Sequence[int] = (6, 6), num_boxes: int = 1,
                 search_depth: int = 30, max_steps: Optional[int] = None,
                 progress_reward: float = 0.0):
        height, width = (int(v) for v in dim_room)
        if height < 4 or width < 4:
            raise ConfigError(f"sokoban: dim_room={list(dim_room)} must be at least [4, 4] "
                              "(walls included)")
        if not 1 <= int(num_boxes) <= (height - 2) * (width - 2) // 3:
            raise ConfigError(f"sokoban: num_boxes={num_boxes} must be between 1 and a third "
                              f"of the {(height - 2) * (width - 2)} inner cells")
        self.height, self.width, self.num_boxes = height, width, int(num_boxes)
        self.search_depth, self.max_steps = int(search_depth), max_steps
        self.progress_reward = float(progress_reward)
        self._left: object = _UNKNOWN  # the cached _solution_left()
        self.walls: FrozenSet[Cell] = frozenset()
        self.targets: FrozenSet[Cell] = frozenset()
        self.boxes: set = set()
        self.player: Cell = (0, 0)
        self.steps = 0

    # -- generation -----------------------------------------------------------------------
    def _carve(self, rng: random.Random) -> set:
        inner = (self.height - 2) * (self.width - 2)
        wanted = max(self.num_boxes * 3 + 2, int(inner * 0.6))
        cell = (rng.randrange(1, self.height - 1), rng.randrange(1, self.width - 1))
        floor = {cell}
        while len(floor) < wanted:
            step = _add(cell, rng.choice(list(MOVES.values())))
            if 1 <= step[0] < self.height - 1 and 1 <= step[1] < self.width - 1:
                cell = step
                floor.add(cell)
        return floor

    def _generate(self, rng: random.Random) -> None:
        for _ in range(100):
            floor = self._carve(rng)
            cells = sorted(floor)
            rng.shuffle(cells)
            targets, player = cells[:self.num_boxes], cells[self.num_boxes]
            boxes = set(targets)
            for _ in range(self.search_depth):  # walk backwards, pulling boxes
                move = rng.choice(list(MOVES.values()))
                ahead = _add(player, move)
                if ahead not in floor or ahead in boxes:
                    continue
                behind = (player[0] - move[0], player[1] - move[1])
                if behind in boxes and rng.random() < 0.8:
                    boxes.remove(behind)
                    boxes.add(player)
                player = ahead
            if boxes != set(targets):
                self.walls = frozenset((r, c) for r in range(self.height)
                                       for c in range(self.width) if (r, c) not in floor)
                self.targets, self.boxes, self.player = frozenset(targets), boxes, player
                return
        raise ConfigError(f"sokoban: could not generate a {self.height}x{self.width} puzzle "
                          f"with {self.num_boxes} box(es); raise search_depth or dim_room")

    # -- the API --------------------------------------------------------------------------
    def reset(self, seed: Optional[int] = None) -> str:
        self._generate(random.Random(seed))
        self.steps = 0
        self._left = _UNKNOWN
        return self.render()

    def solved(self) -> bool:
        return self.boxes == set(self.targets)

    def _solution_left(self) -> Optional[int]:
        """Moves of the shortest solution from here (None: unsolvable); the search runs once
        per state, as the last step's result is the next step's start."""
        if self._left is _UNKNOWN:
            plan = solve(self)
            self._left = len(plan) if plan is not None else None
        return self._left

    def step(self, action: str) -> StepResult:
        move = MOVES.get(str(action).strip().lower())
        was_solved = self.solved()
        before = self._solution_left() if self.progress_reward else None
        self.steps += 1
        reward, valid = STEP_REWARD, move is not None
        if move is not None:
            ahead = _add(self.player, move)
            if ahead in self.boxes:
                beyond = _add(ahead, move)
                if beyond not in self.walls and beyond not in self.boxes:
                    self.boxes.remove(ahead)
                    self.boxes.add(beyond)
                    reward += (BOX_ON if beyond in self.targets else 0.0) + \
                        (BOX_OFF if ahead in self.targets else 0.0)
                    self.player = ahead
            elif ahead not in self.walls:
                self.player = ahead
        success = self.solved()
        if success and not was_solved:
            reward += SOLVED
        self._left = _UNKNOWN  # the state moved
        if before is not None:
            after = self._solution_left()
            reward += self.progress_reward * (before - after) if after is not None else 0.0
        done = success or (self.max_steps is not None and self.steps >= self.max_steps)
        return self.render(), reward, done, {"success": success, "action_is_valid": valid}

    def render(self) -> str:
        rows = []
        for r in range(self.height):
            row = []
            for c in range(self.width):
                cell, target = (r, c), (r, c) in self.targets
                if cell in self.walls:
                    row.append("#")
                elif cell == self.player:
                    row.append("S" if target else "P")
                elif cell in self.boxes:
                    row.append("*" if target else "X")
                else:
                    row.append("O" if target else "_")
            rows.append("".join(row))
        return "\n".join(rows)


def solve(env: Sokoban, max_states: int = 200_000) -> Optional[List[str]]:
    """A shortest action list solving ``env`` from its current state (breadth-first over
    player and box positions), or None beyond ``max_states``."""
    start = (env.player, frozenset(env.boxes))
    seen = {start}
    queue = deque([(start, [])])
    while queue and len(seen) <= max_states:
        (player, boxes), path = queue.popleft()
        if boxes == env.targets:
            return [name.capitalize() for name in path]
        for name, move in MOVES.items():
            ahead = _add(player, move)
            if ahead in env.walls:
                continue
            moved = boxes
            if ahead in boxes:
                beyond = _add(ahead, move)
                if beyond in env.walls or beyond in boxes:
                    continue
                moved = (boxes - {ahead}) | {beyond}
            state = (ahead, moved)
            if state not in seen:
                seen.add(state)
                queue.append((state, path + [name]))
    return None
