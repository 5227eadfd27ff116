"""Rule-based scorers, chosen by a row's ``data_source``.

``default_compute_score`` is what the reward managers use when no
``custom_reward_function.path`` is configured. Adding a data source means adding one
entry to ``SCORERS`` (each scorer takes ``(solution_str, ground_truth, extra_info)``).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Dict

from siirl.engine.reward_score import arithmetic, chat_arithmetic, gsm8k, math_answer, repeat
from siirl.errors import ConfigError

Scorer = Callable[[str, Any, Any], Any]

SCORERS: Dict[str, Scorer] = {
    "arithmetic": arithmetic.compute_score,
    "chat_arithmetic": chat_arithmetic.compute_score,
    "repeat": repeat.compute_score,
    "openai/gsm8k": partial(gsm8k.compute_score, method="strict"),
    "gsm8k": partial(gsm8k.compute_score, method="strict"),
    "lighteval/MATH": math_answer.compute_score,
    "DigitalLearningGmbH/MATH-lighteval": math_answer.compute_score,
    "math": math_answer.compute_score,
    "HuggingFaceH4/MATH-500": math_answer.compute_score,
}


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> float | Dict[str, Any]:
    """Score one response with the rule registered for ``data_source``."""
    scorer = SCORERS.get(data_source)
    if scorer is None:
        raise ConfigError(
            f"no built-in reward rule for data_source '{data_source}' (known: "
            f"{', '.join(sorted(SCORERS))}); set custom_reward_function.path (and .name) "
            "to a Python file defining your own compute_score")
    return scorer(solution_str, ground_truth, extra_info)


__all__ = ["SCORERS", "default_compute_score"]
