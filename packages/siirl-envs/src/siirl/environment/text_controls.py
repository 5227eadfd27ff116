"""Learning controls for AGENTIC runs (text environments), set per tag in ``custom_envs``:

* ``action_words: {Left: Up, Up: Left}`` - the word the agent says -> the action the
  environment takes (case-insensitive; words not named pass unchanged). A model taught the
  environment's own words starts near zero on the permuted task; learning it shows the
  pipeline teaches something new.
* ``reward: coin_flip`` - every training episode's score is 0 or 1 by a fair coin (seeded by
  the run seed, the step and the episode's key), whatever the agent did: format penalties,
  the environment's rewards and where the episode ended play no part. Validation keeps the
  environment's rewards and success, so it measures the real task; a policy trained on the
  coin has nothing to learn, and its validation should only drift.
"""

from __future__ import annotations

import random
from typing import Any, Dict, Mapping, Optional

from siirl.errors import ConfigError

REWARDS = ("env", "coin_flip")


def action_words(tag: str, entry: Mapping[str, Any]) -> Optional[Dict[str, str]]:
    """``custom_envs.<tag>.action_words`` as ``{said word (lower case): env action}``; None
    when unset. Two said words may not map to one action (it would not be a permutation)."""
    words = entry.get("action_words")
    if words is None:
        return None
    where = f"custom_envs.{tag}.action_words"
    if not isinstance(words, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and k.strip() and v.strip()
            for k, v in words.items()):
        raise ConfigError(f"{where}={words!r} must map the words the agent says to the "
                          "environment's actions, e.g. {Left: Up, Up: Left}")
    mapped = {k.strip().lower(): v.strip() for k, v in words.items()}
    targets = [v.lower() for v in mapped.values()]
    if len(set(targets)) != len(targets):
        raise ConfigError(f"{where}={dict(words)!r} sends two words to one action; give a "
                          "permutation (each action once)")
    return mapped


def said_to_env(mapping: Optional[Dict[str, str]], action: str) -> str:
    """The environment's action for the agent's parsed ``action``."""
    if not mapping:
        return action
    return mapping.get(action.strip().lower(), action)


def reward_kind(tag: str, entry: Mapping[str, Any]) -> str:
    kind = str(entry.get("reward", "env"))
    if kind not in REWARDS:
        raise ConfigError(f"custom_envs.{tag}.reward={kind!r}: use env (the environment's "
                          "rewards) or coin_flip (a fair coin per episode, a control)")
    return kind


def coin_flip(episode: Any, run_seed: int, step: int) -> None:
    """Replace ``episode``'s rewards by one fair coin, paid on its last turn."""
    coin = float(random.Random(f"coin:{run_seed}:{step}:{episode.key}").random() < 0.5)
    episode.reward = coin
    if episode.turn_rewards:
        episode.turn_rewards = [0.0] * (len(episode.turn_rewards) - 1) + [coin]
