"""What siiRL's GSM8K tool and interaction share: one answer state per conversation, graded
with the GSM8K rule (``siirl.engine.reward_score.gsm8k``, flexible: the last number of the
answer; 1.0 right, 0.0 otherwise)."""

from __future__ import annotations

from typing import Any, Dict, Optional
from uuid import uuid4

from siirl.engine.reward_score.gsm8k import compute_score


class AnswerStates:
    def __init__(self):
        self.states: Dict[str, Dict[str, Any]] = {}

    def open(self, instance_id: Optional[str], ground_truth: Any) -> str:
        instance_id = instance_id or str(uuid4())
        self.states[instance_id] = {"response": "", "ground_truth": ground_truth,
                                    "reward": 0.0}
        return instance_id

    def answer(self, instance_id: str, text: str) -> None:
        # the rule's strict form marks the answer with "#### "; the flexible one reads either
        self.states[instance_id]["response"] = text if text.startswith("#### ") \
            else "#### " + text

    def score(self, instance_id: str) -> float:
        state = self.states[instance_id]
        return compute_score(state["response"], state["ground_truth"], method="flexible",
                             format_score=0.0, score=1.0)

    def close(self, instance_id: str) -> None:
        self.states.pop(instance_id, None)
