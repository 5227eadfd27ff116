"""siiRL's (and verl's) tool schemas: an OpenAI function-tool schema as pydantic models, the
type siiRL's tools are built with (``BaseTool(config, tool_schema)``) and the
``tool_schema`` of a tool config file. Field names follow siiRL's
``siirl/execution/rollout_flow/multiturn/tools/schemas.py``; a property or parameter block
may carry further JSON-schema keys (``items``, ``minimum``...), which are kept and shown to
the model, where siiRL's models would drop them.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter: its JSON type, description and allowed values."""

    model_config = ConfigDict(extra="allow")

    type: str
    description: Optional[str] = None
    enum: Optional[list[str]] = None


class OpenAIFunctionParametersSchema(BaseModel):
    """The parameters object: ``{"type": "object", "properties": {...}, "required": [...]}``."""

    model_config = ConfigDict(extra="allow")

    type: str
    properties: dict[str, OpenAIFunctionPropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    """The function the model calls: name, description, parameters."""

    name: str
    description: str
    parameters: OpenAIFunctionParametersSchema
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """A tool in OpenAI's format: ``{"type": "function", "function": {...}}``."""

    type: str
    function: OpenAIFunctionSchema


__all__ = ["OpenAIFunctionParametersSchema", "OpenAIFunctionPropertySchema",
           "OpenAIFunctionSchema", "OpenAIFunctionToolSchema"]
