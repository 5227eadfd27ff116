"""Rule reward for siiRL's built-in repeat task ("ab*3=" -> "ababab")."""

from __future__ import annotations

from typing import Any, Dict

# what a decode that keeps special tokens may leave after the answer
_TRAILERS = ("</s>", "<pad>")


def answer_of(solution_str: str) -> str:
    """The response without surrounding whitespace and trailing EOS/padding tokens."""
    text = solution_str.strip()
    while text.endswith(_TRAILERS):
        text = text[: -len(next(t for t in _TRAILERS if text.endswith(t)))].rstrip()
    return text


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> Dict[str, Any]:
    """1.0 when the response is exactly the repeated unit, else 0.0: a letter too many or
    too few is wrong (counting the repetitions is the task)."""
    acc = answer_of(solution_str) == str(ground_truth).strip()
    return {"score": 1.0 if acc else 0.0, "acc": acc}
