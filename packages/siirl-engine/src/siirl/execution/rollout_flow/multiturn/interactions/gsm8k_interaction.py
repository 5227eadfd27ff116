"""siiRL's (and verl's) ``Gsm8kInteraction``: a simulated user that grades the assistant's
latest reply against the row's ground truth (``extra_info.interaction_kwargs.ground_truth``)
and either ends the conversation ("Your response is correct!", score 1.0) or asks it to try
again (score 0.0).

The reply graded is the latest *assistant* message, as in verl's current version (siiRL's
copy reads the latest user message, which grades the question instead of the answer).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from siirl.execution.rollout_flow.multiturn.gsm8k_state import AnswerStates
from siirl.execution.rollout_flow.multiturn.interactions.base import BaseInteraction

RIGHT = "Your response is correct!"
WRONG = "Your response is incorrect! You need to reflect on your answer and try again."


class Gsm8kInteraction(BaseInteraction):
    def __init__(self, config: Optional[Dict[str, Any]] = None):
        super().__init__({"name": "gsm8k", **(config or {})})
        self._answers = AnswerStates()

    async def start_interaction(self, instance_id: Optional[str] = None,
                                ground_truth: Any = None, **kwargs: Any) -> str:
        return self._answers.open(instance_id, ground_truth)

    async def generate_response(self, instance_id: str, messages: List[Dict[str, Any]],
                                **kwargs: Any) -> Tuple[bool, str, float, dict]:
        reply = next((m.get("content") or "" for m in reversed(messages)
                      if m.get("role") == "assistant"), "")
        self._answers.answer(instance_id, reply)
        reward = await self.calculate_score(instance_id)
        return (True, RIGHT, reward, {}) if reward == 1.0 else (False, WRONG, reward, {})

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return self._answers.score(instance_id)

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._answers.close(instance_id)
