"""Adapters that bring existing environment suites through the :class:`TextEnv` API.

- ``env_type: gem`` (extra ``siirl-envs[gem]``): GEM's games, reasoning-gym tasks and
  math environments, ``env_config: {env_id: "game:GuessTheNumber-v0-easy", ...}``.
- ``env_type: textarena`` (extra ``siirl-envs[textarena]``): TextArena's single-player
  games, and two-player games against a fixed opponent, ``env_config: {env_id:
  "GuessTheNumber-v0", ...}``.

Both suites seed Python's (and GEM numpy's) process-wide random generators and draw from
them while stepping. Several environments share a worker process, so each adapter keeps
its own generator state and swaps it in around every call to the suite
(:class:`PrivateRandom`): the same seed gives the same episode whatever else runs in the
process, and the caller's random state is left as it was.
"""

from __future__ import annotations

import random
import re
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from siirl.errors import PluginNotFoundError

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def last_answer(reply: str) -> Optional[str]:
    """The text of the last ``<answer>`` block in ``reply``, or None."""
    found = _ANSWER.findall(reply or "")
    return found[-1].strip() if found else None


def import_suite(module: str, env_type: str, extra: str) -> Any:
    """``import module``, or a PluginNotFoundError naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PluginNotFoundError(
            f"environment '{env_type}' needs the '{module}' package ({exc}): pip install "
            f"\"siirl-envs[{extra}]\"") from None


class PrivateRandom:
    """A generator state of one environment's own for ``random`` and ``numpy.random``."""

    def __init__(self) -> None:
        self._state: Optional[tuple] = None

    @contextmanager
    def active(self) -> Iterator[None]:
        import numpy as np

        outside = random.getstate(), np.random.get_state()
        if self._state is not None:
            random.setstate(self._state[0])
            np.random.set_state(self._state[1])
        try:
            yield
        finally:
            self._state = random.getstate(), np.random.get_state()
            random.setstate(outside[0])
            np.random.set_state(outside[1])
