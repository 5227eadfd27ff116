"""Example custom reward: GSM8K with *flexible* answer extraction.

Use it with::

    custom_reward_function.path=<this file> custom_reward_function.name=compute_score

The built-in GSM8K rule is strict (the answer must follow "#### "); this one accepts the
last number in the response, which suits models that were never taught the "####"
format. Self-contained (standard library only) so it can be copied and edited.
"""

from __future__ import annotations

import re
from typing import Any, Optional

# The answer is at the end; scanning only the tail keeps the regex cheap on long outputs.
_CLIP_CHARS = 300
_NUMBER = re.compile(r"-?[0-9.,]+")


def extract_last_number(text: str) -> Optional[str]:
    """Last number in ``text``, commas and a sentence-ending period removed."""
    for candidate in reversed(_NUMBER.findall(text[-_CLIP_CHARS:])):
        cleaned = candidate.replace(",", "").rstrip(".")
        if cleaned not in ("", "-"):
            return cleaned
    return None


def _same_number(a: str, b: str) -> bool:
    # "18" and "18.00" are the same answer; fall back to strings for non-numbers.
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: Any = None, format_score: float = 0.0,
                  score: float = 1.0) -> dict:
    """``score`` if the last number equals the ground truth, ``format_score`` if it is
    another number, 0.0 if there is none; "acc" says whether it was right."""
    answer = extract_last_number(solution_str)
    if answer is None:
        return {"score": 0.0, "acc": False}
    expected = str(ground_truth).strip().replace(",", "")
    acc = _same_number(answer, expected)
    return {"score": float(score) if acc else float(format_score), "acc": acc}
