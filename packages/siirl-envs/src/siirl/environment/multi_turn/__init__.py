"""Multi-turn tool calling for the plain RLVR pipelines (``rollout.multi_turn.*``): the
tool loop and the ``multi_turn`` rollout plugin that wraps the configured engine."""

from siirl.environment.multi_turn.conversation import Conversation, ToolLoop
from siirl.environment.multi_turn.rollout import MultiTurnRollout

__all__ = ["Conversation", "MultiTurnRollout", "ToolLoop"]
