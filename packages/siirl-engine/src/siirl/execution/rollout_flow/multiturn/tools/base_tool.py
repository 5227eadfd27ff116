"""siiRL's ``BaseTool``: the base class of a stateful multi-turn tool, which a user's tool
subclasses as in siiRL (``from siirl.execution.rollout_flow.multiturn.tools.base_tool import
BaseTool``).

The multi-turn rollout (siirl-envs, ``siirl.environment.tools``) drives it per
conversation: ``create(**create_kwargs)`` when the conversation starts (the row's
``extra_info.tools_kwargs.<tool name>.create_kwargs``), ``execute(instance_id, parameters)
-> (text, step_reward, metrics)`` for each call the model makes, ``release(instance_id)``
when the conversation ends; each may be a coroutine, as siiRL's are. The tool config file's
``tool_schema`` reaches the constructor as an ``OpenAIFunctionToolSchema``
(``validate_tool_schema``), and the chat template gets ``schema``, its dict.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple
from uuid import uuid4

from pydantic import ValidationError

from siirl.errors import ConfigError
from siirl.execution.rollout_flow.multiturn.tools.schemas import OpenAIFunctionToolSchema


class BaseTool:
    """A tool with one state per conversation (an ``instance_id``).

    A subclass implements ``execute`` and, where it keeps state, ``create`` and ``release``;
    ``calc_reward`` grades an instance's state (0.0 here: a tool that does not grade). A
    subclass without a ``tool_schema`` in its config file returns its own from
    ``get_openai_tool_schema``.
    """

    def __init__(self, config: Optional[Dict[str, Any]],
                 tool_schema: Optional[OpenAIFunctionToolSchema | Dict[str, Any]]):
        self.config = config if config is not None else {}
        if tool_schema is None:
            tool_schema = self.get_openai_tool_schema()
        if tool_schema is None:
            raise ConfigError(f"tool {type(self).__name__}: no tool_schema (give one in the "
                              "tool config file, or return it from get_openai_tool_schema)")
        self.tool_schema = self.validate_tool_schema(tool_schema)
        self.name = self.tool_schema.function.name

    @classmethod
    def validate_tool_schema(cls, schema: Any) -> OpenAIFunctionToolSchema:
        """A tool config's ``tool_schema`` (a mapping) as the model this tool is built with."""
        if isinstance(schema, OpenAIFunctionToolSchema):
            return schema
        try:
            return OpenAIFunctionToolSchema.model_validate(schema)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'tool_schema'}: {e['msg']}"
                                 for e in exc.errors())
            raise ConfigError(f"tool {cls.__name__}: tool_schema is not an OpenAI function "
                              f"schema {{type, function: {{name, description, parameters}}}}: "
                              f"{problems}") from None

    def get_openai_tool_schema(self) -> Optional[OpenAIFunctionToolSchema]:
        return getattr(self, "tool_schema", None)

    @property
    def schema(self) -> Dict[str, Any]:
        """The schema the chat template shows the model (unset and null fields left out)."""
        return self.tool_schema.model_dump(exclude_unset=True, exclude_none=True)

    async def create(self, instance_id: Optional[str] = None, **kwargs: Any) -> str:
        """Start an instance for one conversation; its id."""
        return instance_id if instance_id is not None else str(uuid4())

    async def execute(self, instance_id: str, parameters: Dict[str, Any],
                      **kwargs: Any) -> Tuple[str, float, dict]:
        """One call: ``(text the model reads, step reward, metrics)``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement "
                                  "execute(instance_id, parameters)")

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """End the instance (free its state)."""


__all__ = ["BaseTool", "OpenAIFunctionToolSchema"]
