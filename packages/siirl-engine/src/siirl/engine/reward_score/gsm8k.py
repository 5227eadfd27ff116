"""GSM8K rule reward (same rule as verl's ``gsm8k.compute_score``).

strict: the answer is the number after the last ``#### `` marker (the format the GSM8K
solutions use, so the policy is also rewarded for producing it); flexible: the last
number anywhere in the text. A wrong answer in the right place earns ``format_score``.
"""

from __future__ import annotations

import re
from typing import Any

# Regexes over very long responses are slow and the answer is at the end: look at the
# tail only (verl clips to 300 characters as well).
_CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string (commas removed) or None when there is none."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        if not found:
            return None
        return found[-1].replace(",", "").replace("$", "")
    for candidate in reversed(_NUMBER.findall(tail)):
        # Thousands separators and a sentence-ending period are not part of the number:
        # "The answer is 1,000." must give "1000". (verl keeps the period, which turns a
        # right flexible answer at the end of a sentence into a miss.)
        cleaned = candidate.replace(",", "").rstrip(".")
        if cleaned not in ("", "-"):
            return cleaned
    return None


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """``score`` for the right answer, ``format_score`` for a wrong one, 0.0 for none."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    expected = str(ground_truth).strip().replace(",", "")
    return float(score) if answer == expected else float(format_score)
