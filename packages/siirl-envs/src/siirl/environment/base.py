"""The text environment API every agentic environment implements.

An episode: ``reset(seed)`` gives the first observation; each ``step(action)`` takes the
agent's action (the text the environment's :meth:`TextEnv.parse_action` found in the
model's reply) and gives ``(observation, reward, done, info)``, as gymnasium does with text
in and out. Observations are text or chat messages (``[{"role": ..., "content": ...}]``).
``info`` may carry ``success`` (the episode's goal reached) and ``action_is_valid``.

The same seed gives the same episode, so a group of GRPO samples starts from one state
and a resumed run replays its environments.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Optional, Tuple, Union

Observation = Union[str, List[Dict[str, str]]]
StepResult = Tuple[Observation, float, bool, Dict[str, Any]]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


class TextEnv(ABC):
    """Base class of text environments (registered under ``siirl.environments``)."""

    #: how the agent is told to act, shown once at the start of an episode
    instructions: str = "Reply with your action inside <answer></answer>."

    @abstractmethod
    def reset(self, seed: Optional[int] = None) -> Observation:
        """Start an episode (the same ``seed``, the same episode); the first observation."""

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Act; ``(observation, reward, done, info)``."""

    def parse_action(self, reply: str) -> Optional[str]:
        """The action in the model's ``reply``, or None when its format is wrong (the env
        manager then applies its format penalty). Default: the last ``<answer>`` block."""
        found = _ANSWER.findall(reply or "")
        return found[-1].strip() if found else None

    def render(self) -> str:
        """The current state as text (validation logs, debugging)."""
        return ""

    def close(self) -> None:  # noqa: B027 - optional: most environments hold nothing
        """Release what the environment holds (processes, renderers)."""

    def __enter__(self) -> TextEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
