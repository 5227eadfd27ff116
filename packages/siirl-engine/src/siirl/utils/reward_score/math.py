"""siiRL's ``siirl.utils.reward_score.math`` (MARFT's math environment and siiRL's MATH
preprocessing import it): the MATH rule of ``siirl.engine.reward_score.math_answer`` under
siiRL's names. ``siirl.utils.reward_score`` spans siirl-engine and siirl-envs (prime_code)."""

from __future__ import annotations

from typing import Any, Optional

from siirl.engine.reward_score import math_answer


def compute_score(solution_str: str, ground_truth: Any) -> float:
    """1.0 when the last ``\\boxed{...}`` of ``solution_str`` equals ``ground_truth`` after
    the MATH normalisation, else 0.0."""
    return math_answer.compute_score(solution_str, ground_truth)


def strip_string(string: str) -> str:
    return math_answer.normalize_answer(string)


def is_equiv(str1: Optional[str], str2: Optional[str], verbose: bool = False) -> bool:
    if str1 is None or str2 is None:
        return str1 is None and str2 is None
    return strip_string(str1) == strip_string(str2)


def last_boxed_only_string(string: str) -> Optional[str]:
    """The last box of ``string`` as ``\\boxed{...}`` (None: no closed box)."""
    inner = math_answer.last_boxed(string)
    return None if inner is None else "\\boxed{" + inner + "}"


def remove_boxed(s: str) -> str:
    """The contents of a box ``last_boxed_only_string`` returned."""
    for left in ("\\boxed ", "\\boxed{", "\\fbox{"):
        if s.startswith(left):
            inner = s[len(left):]
            return inner if left.endswith(" ") else inner[:-1] if inner.endswith("}") \
                else inner
    raise ValueError(f"not a box: {s[:40]!r}")
