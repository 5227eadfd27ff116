"""siiRL's (and verl's) ``Gsm8kTool``: the model submits its answer to ``calc_gsm8k_reward``
and reads back how it was parsed and graded.

Per conversation (``create``, from the row's ``extra_info.tools_kwargs.calc_gsm8k_reward.
create_kwargs.ground_truth``): the latest answer and its grade. ``execute`` grades the new
answer and returns ``("Current parsed answer='...' reward=...", step_reward, {})``, where
the step reward is 0.0 when the grade went up and -0.05 otherwise (a penalty for
resubmitting an answer that is no better).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from siirl.execution.rollout_flow.multiturn.gsm8k_state import AnswerStates
from siirl.execution.rollout_flow.multiturn.tools.base_tool import BaseTool
from siirl.execution.rollout_flow.multiturn.tools.schemas import OpenAIFunctionToolSchema

_DEFAULT_SCHEMA = {"type": "function", "function": {
    "name": "calc_gsm8k_reward",
    "description": "A tool for calculating the reward of gsm8k",
    "parameters": {"type": "object", "required": ["answer"], "properties": {
        "answer": {"type": "string", "description": "The answer to the question"}}}}}
NO_GAIN_PENALTY = -0.05


class Gsm8kTool(BaseTool):
    def __init__(self, config: Optional[Dict[str, Any]] = None, tool_schema: Any = None):
        super().__init__(dict(config or {}), tool_schema)
        self._answers = AnswerStates()

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The config file's schema, else siiRL's default one."""
        return getattr(self, "tool_schema", None) or self.validate_tool_schema(_DEFAULT_SCHEMA)

    async def create(self, instance_id: Optional[str] = None, ground_truth: Any = None,
                     **kwargs: Any) -> str:
        return self._answers.open(instance_id, ground_truth)

    async def execute(self, instance_id: str, parameters: Dict[str, Any],
                      **kwargs: Any) -> Tuple[str, float, dict]:
        answer = parameters.get("answer", "")
        answer = answer if isinstance(answer, str) else str(answer)
        self._answers.answer(instance_id, answer)
        reward = await self.calc_reward(instance_id)
        state = self._answers.states[instance_id]
        step_reward = 0.0 if reward > state["reward"] else NO_GAIN_PENALTY
        state["reward"] = reward
        return f"Current parsed {answer=} {reward=}", step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return self._answers.score(instance_id)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._answers.close(instance_id)
