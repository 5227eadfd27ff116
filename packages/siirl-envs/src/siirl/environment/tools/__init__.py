"""Tools an agent calls during a multi-turn rollout: the tool-call parser, the built-in
calculator and sandboxed python tools, and loading a verl-format tool config."""

from siirl.environment.tools.parsing import FORMATS, ToolCall, parse_tool_calls, truncate
from siirl.environment.tools.registry import (
    CalculatorTool,
    PythonTool,
    Tool,
    ToolSet,
    load_tools,
)
from siirl.environment.tools.sandbox import SandboxResult, run_python

__all__ = ["FORMATS", "CalculatorTool", "PythonTool", "SandboxResult", "Tool", "ToolCall",
           "ToolSet", "load_tools", "parse_tool_calls", "run_python", "truncate"]
