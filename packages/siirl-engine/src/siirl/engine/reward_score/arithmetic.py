"""Rule reward for siiRL's built-in arithmetic task ("23+45=" -> "68")."""

from __future__ import annotations

import re
from typing import Any, Dict

# A leading minus belongs to the number ("-5"), so negative answers can be right.
_INTEGER = re.compile(r"-?\d+")


def first_integer(text: str) -> int | None:
    """The first integer in ``text`` (``"-12 apples"`` -> -12), or None."""
    match = _INTEGER.search(text)
    return int(match.group()) if match else None


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> Dict[str, Any]:
    """1.0 when the response's first integer equals the ground truth, else 0.0.

    The *first* integer is used because the task asks for the bare answer right after
    "="; anything the policy rambles on with afterwards must not rescue a wrong start.
    """
    answer = first_integer(solution_str)
    try:
        expected = int(str(ground_truth).strip())
    except ValueError:
        expected = None  # a non-integer ground truth can never be matched
    acc = answer is not None and answer == expected
    return {"score": 1.0 if acc else 0.0, "acc": acc}
