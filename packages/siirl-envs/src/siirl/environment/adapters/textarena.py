"""TextArena (``env_type: textarena``, extra ``siirl-envs[textarena]``): any game of the
``textarena`` suite by its id, ``env_config: {env_id: ..., <the game's own kwargs>}``.

Single-player games (``GuessTheNumber-v0``, ``TowerOfHanoi-v0``, ``Minesweeper-v0-small``,
``Sudoku-v0-very-easy``, ``Mastermind-v0``, ...) need nothing more. A two-player game
(``TicTacToe-v0``, ``ConnectFour-v0``, ...) needs a fixed opponent: ``opponent:
"my_package.bots:play"``, a function from the opponent's observation text to its action
text; the agent is ``player_id`` (0) and the opponent's moves happen inside
:meth:`TextArenaEnv.step` until it is the agent's turn again. Games with more players are
not supported.

Actions: TextArena games read a bracketed move from the reply (``[5]``, ``[reveal 3 2]``,
``[A C]``). The agent is told siiRL's convention, and :meth:`TextArenaEnv.parse_action`
turns ``<answer>5</answer>`` into ``[5]`` (an answer already in brackets is kept); a reply
without ``<answer>`` but with a bracketed move (TextArena's own prompts ask for one) is
passed through. TextArena's observation and action wrappers (the ``-train``/default
variants) are not applied: the env manager keeps the chat history, so each observation is
only what is new since the agent's last move (the agent's own move is not echoed).

Reward and success: TextArena rewards an episode at its end (1 solved or won, 0 a draw,
-1 a loss; partial credit for single-player games cut off by their turn limit); steps
before the end give 0. Success is a final reward reaching ``success_reward`` (1.0).
Seeds: TextArena seeds ``random`` at ``reset(seed)``; the adapter keeps that state private
to the environment (see :mod:`siirl.environment.adapters`), so an episode replays exactly.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable, Dict, List, Optional, Union

from siirl.environment.adapters import PrivateRandom, import_suite, last_answer
from siirl.environment.base import StepResult, TextEnv
from siirl.errors import ConfigError

_BRACKETED = re.compile(r"\[[^\[\]]+\]")
GAME_ID = -1  # TextArena's sender id of game messages


def _load_opponent(opponent: Union[str, Callable, None]) -> Optional[Callable[[str], str]]:
    if opponent is None or callable(opponent):
        return opponent
    module, _, name = str(opponent).partition(":")
    if not module or not name:
        raise ConfigError(f"textarena: opponent={opponent!r} must be 'module:function'")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"textarena: cannot load opponent {opponent!r}: {exc}") from None
    if not callable(found):
        raise ConfigError(f"textarena: opponent {opponent!r} is not callable")
    return found


class TextArenaEnv(TextEnv):
    instructions = (
        "Follow the game's rules below. Reply with your move inside <answer></answer>, "
        "e.g. <answer>5</answer>; it is passed to the game as [5].")

    def __init__(self, env_id: str, opponent: Union[str, Callable, None] = None,
                 player_id: int = 0, success_reward: float = 1.0, **kwargs: Any):
        if not env_id:
            raise ConfigError("textarena: env_id is required (e.g. 'GuessTheNumber-v0')")
        if int(player_id) not in (0, 1):
            raise ConfigError(f"textarena: player_id={player_id} must be 0 or 1")
        self.env_id, self.kwargs = str(env_id), dict(kwargs)
        self.opponent = _load_opponent(opponent)
        self.player_id = int(player_id) if self.opponent else 0
        self.num_players = 2 if self.opponent else 1
        self.success_reward = float(success_reward)
        self._env: Any = None
        self._random = PrivateRandom()
        self._last = ""
        self._done = False

    def _build(self) -> Any:
        ta = import_suite("textarena", "textarena", "textarena")
        from textarena.envs.registration import ENV_REGISTRY

        if self.env_id not in ENV_REGISTRY:
            near = [name for name in ENV_REGISTRY if self.env_id.lower() in name.lower()]
            raise ConfigError(f"textarena: unknown env_id {self.env_id!r}" + (
                f"; similar: {', '.join(near[:10])}" if near else ""))
        env = ta.make(self.env_id, **self.kwargs)
        while isinstance(env, ta.Wrapper):  # observations and actions are formatted here
            env = env.env
        return env

    @property
    def suite_env(self) -> Any:
        """The suite's own environment object (None before the first reset)."""
        return self._env

    # -- episodes ---------------------------------------------------------------------------
    def reset(self, seed: Optional[int] = None) -> str:
        with self._random.active():
            if self._env is None:
                self._env = self._build()
            try:
                self._env.reset(num_players=self.num_players,
                                seed=None if seed is None else int(seed) % 2 ** 32)
            except AssertionError as exc:  # the game's own check of the player count
                raise ConfigError(f"textarena: {self.env_id} cannot be played by "
                                  f"{self.num_players} player(s) ({exc}); a two-player game "
                                  "needs an opponent") from None
            self._done = False
            text, _ = self._play_opponent()
        self._last = text
        return text

    def parse_action(self, reply: str) -> Optional[str]:
        answer = last_answer(reply)
        if answer is not None:
            return answer if _BRACKETED.search(answer) else f"[{answer}]"
        return reply if _BRACKETED.search(reply or "") else None

    def step(self, action: str) -> StepResult:
        if self._env is None or self._done:
            raise RuntimeError("textarena: step() before reset() or after the episode ended")
        with self._random.active():
            done, _ = self._env.step(action)
            if not done:
                text, done = self._play_opponent()
        if not done:
            self._last = text
            return text, 0.0, False, {"success": False}
        return self._finish()

    def _play_opponent(self) -> tuple:
        """Let the opponent move until it is the agent's turn or the game ends; the agent's
        observation (what is new for it) and whether the game ended."""
        done = False
        while not done and self._env.state.current_player_id != self.player_id:
            seat, messages = self._env.get_observation()
            done, _ = self._env.step(self.opponent(self._format(messages, seat)))
        if done:
            return "", True
        seat, messages = self._env.get_observation()
        return self._format(messages, seat), False

    def _finish(self) -> StepResult:
        self._done = True
        rewards, game_info = self._env.close()
        reward = float((rewards or {}).get(self.player_id, 0.0))
        mine: Dict[str, Any] = dict((game_info or {}).get(self.player_id, {}))
        self._last = str(mine.get("reason", "The game is over."))
        return self._last, reward, True, {"success": reward >= self.success_reward,
                                          "invalid_move": bool(mine.get("invalid_move"))}

    def _format(self, messages: List[tuple], seat: int) -> str:
        """TextArena messages ``(sender, text, kind)`` as lines of text; the player's own
        moves are left out (they are its replies already)."""
        roles = getattr(self._env.state, "role_mapping", {}) or {}
        lines = []
        for sender, text, *_ in messages:
            if sender == seat:
                continue
            lines.append(str(text) if sender == GAME_ID else
                         f"[{roles.get(sender, f'Player {sender}')}] {text}")
        return "\n".join(lines)

    def render(self) -> str:
        board = getattr(self._env, "get_board_str", None)
        if board is not None:
            try:
                return str(board())
            except Exception:  # some games have no board before the first move
                pass
        return self._last

    def close(self) -> None:
        self._env = None  # TextArena's close() ends the game and returns its rewards
