"""siiRL's ``siirl.utils.reward_score.gsm8k``: the GSM8K rule of
``siirl.engine.reward_score.gsm8k`` with siiRL's (verl's) argument order."""

from __future__ import annotations

from typing import Any, Optional

from siirl.engine.reward_score import gsm8k


def extract_solution(solution_str: str, method: str = "strict") -> Optional[str]:
    return gsm8k.extract_solution(solution_str, method=method)


def compute_score(solution_str: str, ground_truth: Any, method: str = "strict",
                  format_score: float = 0.0, score: float = 1.0) -> float:
    return gsm8k.compute_score(solution_str, ground_truth, method=method,
                               format_score=format_score, score=score)
