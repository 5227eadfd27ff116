"""siiRL's ``BaseInteraction``: the base class of a simulated user that answers the
assistant's final replies, which a user's interaction subclasses as in siiRL
(``from siirl.execution.rollout_flow.multiturn.interactions.base import BaseInteraction``).

The multi-turn rollout (siirl-envs, ``siirl.environment.multi_turn.interactions``) builds it
as ``cls(config)`` from ``rollout.multi_turn.interaction_config_path`` and drives it per
conversation: ``start_interaction(instance_id, **interaction_kwargs)`` (the row's
``extra_info.interaction_kwargs``), ``generate_response(instance_id, messages) ->
(should_terminate, text, turn_score, info)`` after each final reply, and
``finalize_interaction(instance_id)``; each may be a coroutine, as siiRL's are.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple
from uuid import uuid4


class BaseInteraction:
    """A subclass implements ``generate_response`` and, where it keeps state per
    conversation, ``start_interaction`` and ``finalize_interaction``."""

    def __init__(self, config: Optional[Dict[str, Any]]):
        self.config = config if config is not None else {}
        self.name: str = self.config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: Optional[str] = None, **kwargs: Any) -> str:
        """Start one conversation's state; its id."""
        return instance_id if instance_id is not None else str(uuid4())

    async def generate_response(self, instance_id: str, messages: List[Dict[str, Any]],
                                **kwargs: Any) -> Tuple[bool, str, float, Dict[str, Any]]:
        """The user's next turn: ``(should_terminate, text, turn_score, info)``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement "
                                  "generate_response(instance_id, messages)")

    async def calculate_score(self, instance_id: Optional[str] = None, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: Optional[str] = None,
                                   **kwargs: Any) -> None:
        """End the conversation's state."""


__all__ = ["BaseInteraction"]
