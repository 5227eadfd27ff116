"""Rule reward for the built-in chat_arithmetic task ("What is 4 + 18? ..." -> "22").

A chat model answers in its own words ("4 + 18 = 22", "The answer is 22."), so the answer is
the response's *last* integer (as GSM8K's flexible rule takes the last number); a response
cut off mid-sentence rarely ends in the right one.
"""

from __future__ import annotations

import re
from typing import Any, Dict

_INTEGER = re.compile(r"-?\d+")


def last_integer(text: str) -> int | None:
    """The last integer in ``text`` (``"4 + 18 = 22."`` -> 22), or None."""
    found = _INTEGER.findall(text)
    return int(found[-1]) if found else None


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> Dict[str, Any]:
    """1.0 when the response's last integer equals the ground truth, else 0.0."""
    try:
        expected = int(str(ground_truth).strip())
    except ValueError:
        expected = None  # a non-integer ground truth can never be matched
    answer = last_integer(solution_str)
    acc = answer is not None and answer == expected
    return {"score": 1.0 if acc else 0.0, "acc": acc}
