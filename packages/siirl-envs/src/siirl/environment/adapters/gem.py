"""GEM (``env_type: gem``, extra ``siirl-envs[gem]``): any environment of the ``gem-llm``
suite by its id, ``env_config: {env_id: ..., <the suite's own kwargs>}``.

Ids: the games ``game:GuessTheNumber-v0-easy``, ``game:Minesweeper-v0-easy``,
``game:Mastermind-v0-easy``, ``game:Sudoku-v0-easy``, ``game:TowerofHanoi-v0-easy``,
``game:Wordle-v0-easy`` ... (``-easy``/``-hard``/``-random``); reasoning-gym tasks
``rg:<name>`` (generated, e.g. ``rg:basic_arithmetic``); math datasets ``math:GSM8K`` ...
Other kwargs go to ``gem.make`` (e.g. ``max_turns``, ``min_number``). Wordle and Hangman
fetch nltk's word list on first use, the ``math:``/``code:``/``qa:`` ids download their
dataset from the Hugging Face hub (and need ``datasets``): use them where that is allowed.

``tool: python`` gives the agent GEM's python tool (GEM's ``ToolEnvWrapper``: a reply with
``<python>CODE</python>`` runs the code and returns its output; the final answer ends the
episode), executed in siiRL's sandbox (:mod:`siirl.environment.tools.sandbox`) rather
than GEM's unsandboxed subprocess; ``max_tool_uses`` bounds the calls. Where the
kernel refuses the sandbox's namespaces the environment refuses to start, unless
``tool_allow_uncontained: true`` (trusted code: resource limits only).

Actions: GEM parses the reply itself and reads the last ``\\boxed{...}``. The agent is
told siiRL's convention, ``<answer>...</answer>``, and :meth:`GemEnv.parse_action` turns
``<answer>7</answer>`` into ``\\boxed{7}``; a reply that already holds a ``\\boxed{}``
(GEM's own prompts ask for it), or a python tool call, is passed through as it is. A
reply with neither is a format error for the env manager (its penalty and hint) instead
of ending the episode with GEM's own format penalty.

Success: GEM has no success flag of its own. It is the ``correct`` flag where the
environment gives one (math); for a game that ends by its own rules (terminated, not
truncated), a positive final reward with GEM's win message (a game can also end lost with
a positive progress reward, e.g. 2048); for single-turn tasks (reasoning-gym) and games
cut off by their turn limit, a final reward reaching ``success_reward`` (1.0; partial
credit is not a success). Seeds: GEM seeds ``random`` and
``numpy.random`` at ``reset(seed)``; the adapter keeps that state private to the
environment (see :mod:`siirl.environment.adapters`), so an episode replays exactly.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Dict, Optional

from siirl.environment.adapters import PrivateRandom, import_suite, last_answer
from siirl.environment.base import StepResult, TextEnv
from siirl.errors import ConfigError

TOOLS = ("python",)
_WON = "Congratulations"  # the message of every GEM game's win (gem-llm 0.1)
_PYTHON_CALL = re.compile(r"<python>.*?</python>|```\n?python.*?```", re.DOTALL)


def _gem() -> Any:
    """``import gem``; its import calls ``logging.basicConfig(level=INFO)``, undone here."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    gem = import_suite("gem", "gem", "gem")
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    return gem


def _python_tool(timeout_s: float, allow_uncontained: bool) -> Any:
    """GEM's python tool (its call format and instructions), run in siiRL's sandbox."""
    from gem.tools.python_code_tool import PythonCodeTool

    from siirl.environment.tools import run_python

    class SandboxedPythonTool(PythonCodeTool):
        def execute_action(self, action: str):
            code, parsed_action, is_valid = self._parse_action(action)
            if not is_valid:
                return False, True, "", parsed_action
            result = run_python(code, timeout_s=timeout_s,
                                allow_uncontained=allow_uncontained)
            failed = result.timed_out or result.returncode != 0
            output = "Code execution result: " + result.text().lstrip(" \n") + "\n"
            return True, failed, output, parsed_action

    return SandboxedPythonTool(timeout=int(timeout_s))


class GemEnv(TextEnv):
    instructions = (
        "Follow the task's rules below. Reply with your move or final answer inside "
        "<answer></answer>, e.g. <answer>7</answer>; it is passed to the game as "
        "\\boxed{7}.")

    def __init__(self, env_id: str, tool: Optional[str] = None, max_tool_uses: int = 5,
                 tool_timeout_s: float = 10.0, success_reward: float = 1.0,
                 tool_allow_uncontained: bool = False, **kwargs: Any):
        if not env_id:
            raise ConfigError("gem: env_id is required (e.g. 'game:GuessTheNumber-v0-easy')")
        if tool is not None and tool not in TOOLS:
            raise ConfigError(f"gem: tool={tool!r} is not one of {', '.join(TOOLS)}")
        self.env_id, self.tool, self.kwargs = str(env_id), tool, dict(kwargs)
        self.max_tool_uses, self.tool_timeout_s = int(max_tool_uses), float(tool_timeout_s)
        self.success_reward = float(success_reward)
        self.tool_allow_uncontained = tool_allow_uncontained is True
        if tool == "python" and not self.tool_allow_uncontained:
            from siirl.environment.tools.sandbox import require_isolation

            require_isolation("gem: tool=python", "tool_allow_uncontained: true in the "
                              "environment's env_config", remote=False)
        if tool:
            self.instructions = type(self).instructions + (
                " Before answering you may run Python: reply <python>CODE</python> and you "
                "get its output.")
        self._env: Any = None
        self._random = PrivateRandom()
        self._last = ""

    def _build(self) -> Any:
        gem = _gem()
        from gem.envs.registration import ENV_REGISTRY

        if self.env_id not in ENV_REGISTRY:
            near = [name for name in ENV_REGISTRY if self.env_id.lower() in name.lower()]
            raise ConfigError(f"gem: unknown env_id {self.env_id!r}" + (
                f"; similar: {', '.join(near[:10])}" if near else
                f"; e.g. {', '.join(list(ENV_REGISTRY)[:8])}"))
        env = gem.make(self.env_id, **self.kwargs)
        if self.tool == "python":
            from gem.tools.tool_env_wrapper import ToolEnvWrapper

            env = ToolEnvWrapper(env, tools=[_python_tool(self.tool_timeout_s,
                                                    self.tool_allow_uncontained)],
                                 max_tool_uses=self.max_tool_uses)
        return env

    @property
    def suite_env(self) -> Any:
        """The suite's own environment object (None before the first reset)."""
        return self._env

    def reset(self, seed: Optional[int] = None) -> str:
        with self._random.active():  # constructors may already draw (some call reset())
            if self._env is None:
                self._env = self._build()
            observation, info = self._env.reset(
                seed=None if seed is None else int(seed) % 2 ** 32)
        self._last = str(observation)
        return self._last

    def parse_action(self, reply: str) -> Optional[str]:
        if self.tool and _PYTHON_CALL.search(reply or ""):
            return reply  # a tool call: GEM's wrapper runs the first code block
        answer = last_answer(reply)
        if answer is not None:
            return answer if "\\boxed{" in answer else "\\boxed{" + answer + "}"
        return reply if "\\boxed{" in (reply or "") else None

    def step(self, action: str) -> StepResult:
        if self._env is None:
            raise RuntimeError("gem: step() before reset()")
        with self._random.active():
            observation, reward, terminated, truncated, info = self._env.step(action)
        done = bool(terminated or truncated)
        info: Dict[str, Any] = dict(info or {})
        if "correct" in info:  # math environments grade the answer
            success = bool(info["correct"])
        elif terminated and not truncated:  # a game ended by its rules: won or lost
            success = float(reward) > 0 and _WON in str(observation)
        else:  # single-turn tasks (always truncated) and turn limits: the final score
            success = done and float(reward) >= self.success_reward
        text = "" if _is_terminal_state(observation) else str(observation)
        if not done and info.get("suffix"):
            text = f"{text}\n{info['suffix']}" if text else str(info["suffix"])
        self._last = text or self._last
        info.update(success=success, truncated=bool(truncated))
        return text, float(reward), done, info

    def render(self) -> str:
        return self._last

    def close(self) -> None:
        close: Optional[Callable] = getattr(self._env, "close", None)
        if close is not None:
            close()
        self._env = None


def _is_terminal_state(observation: Any) -> bool:
    from gem.utils.constants import TERMINAL_STATE

    return observation == TERMINAL_STATE
