"""Tools for multi-turn rollouts, from a ``rollout.multi_turn.tool_config_path`` YAML in
verl's format (checked against volcengine/verl
``examples/sglang_multiturn/config/tool_config/*.yaml``)::

    tools:
      - class_name: python            # or calculator, or a dotted path to your own class
        config: {timeout_s: 10, memory_limit_mb: 1024, max_output_chars: 4096,
                 max_processes: 32}   # allow_uncontained: true only for trusted code
        tool_schema:                  # an OpenAI function schema, shown to the model
          type: function
          function:
            name: code_interpreter
            description: Run Python code and see what it prints.
            parameters:
              type: object
              properties: {code: {type: string, description: The code to run.}}
              required: [code]

A class of your own is built as ``cls(config=..., tool_schema=...)`` and called as
``execute(arguments: dict) -> str`` (a coroutine, or a ``(text, ...)`` tuple as verl's
tools return, is accepted too); a subclass of siiRL's ``BaseTool``
(``siirl.execution.rollout_flow.multiturn.tools.base_tool``, stateful: ``instances``) gets
the ``tool_schema`` as its ``OpenAIFunctionToolSchema``, through the class's
``validate_tool_schema``. Whatever a tool does wrong (raises, times out, gets bad
arguments, or is not there) comes back as the tool message's text: it never ends the run.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence

from siirl.environment.tool_math import calculate
from siirl.environment.tools.instances import ToolInstances, is_stateful
from siirl.environment.tools.parsing import ToolCall, truncate
from siirl.environment.tools.sandbox import require_isolation, run_python
from siirl.environment.tools.sandbox_fusion import run_remote
from siirl.errors import ConfigError


def _schema(name: str, description: str, argument: str, what: str) -> Dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "required": [argument],
                       "properties": {argument: {"type": "string", "description": what}}}}}


class Tool:
    """A named function the agent can call."""

    default_schema: Dict[str, Any] = {}

    def __init__(self, config: Optional[Dict[str, Any]] = None,
                 tool_schema: Optional[Dict[str, Any]] = None):
        self.config = dict(config or {})
        self.schema = dict(tool_schema or self.default_schema)
        self.name = str(self.schema.get("function", {}).get("name", ""))

    def execute(self, arguments: Dict[str, Any]) -> str:
        raise NotImplementedError

    def _argument(self, arguments: Dict[str, Any], key: str) -> str:
        if len(arguments) == 1 and key not in arguments:
            return str(next(iter(arguments.values())))  # whatever the schema calls it
        if not isinstance(arguments.get(key), str):
            raise ValueError(f"{self.name} needs a string argument {key!r}, got "
                             f"{sorted(arguments)}")
        return arguments[key]


class CalculatorTool(Tool):
    """Arithmetic: numbers, + - * / // % **, parentheses (``siirl.environment.tool_math``)."""

    default_schema = _schema("calculator", "Evaluate an arithmetic expression.",
                             "expression", "e.g. 37 * (48 - 5)")

    def execute(self, arguments: Dict[str, Any]) -> str:
        value = calculate(self._argument(arguments, "expression"))
        return str(int(value)) if float(value).is_integer() else f"{value:g}"


class PythonTool(Tool):
    """Python code, run in the local sandbox (``tools.sandbox``) or, with a
    ``sandbox_fusion_url`` (tool config, else ``reward_model.sandbox_fusion.url``), on that
    service. Config: ``timeout_s`` (verl: ``default_timeout``), ``memory_limit_mb``,
    ``max_output_chars``, ``max_processes``, and ``allow_uncontained`` (default false:
    where the kernel refuses the sandbox's namespaces the tool refuses to load; true runs
    trusted code there with resource limits only)."""

    default_schema = _schema("python", "Run Python code; you see what it prints.", "code",
                             "The Python code to run.")

    def execute(self, arguments: Dict[str, Any]) -> str:
        code = self._argument(arguments, "code")
        cfg = self.config
        timeout = float(cfg.get("timeout_s", cfg.get("default_timeout", 10.0)))
        memory = int(cfg.get("memory_limit_mb", 1024))
        chars = int(cfg.get("max_output_chars", 4096))
        url = cfg.get("sandbox_fusion_url")
        if url:
            result = run_remote(str(url), code, timeout, memory, chars,
                                int(cfg.get("max_concurrent", 64)),
                                str(cfg.get("default_language", "python")))
        else:
            result = run_python(code, timeout, memory, chars,
                                max_processes=int(cfg.get("max_processes", 32)),
                                allow_uncontained=cfg.get("allow_uncontained") is True)
        return result.text()


BUILT_IN = {"calculator": CalculatorTool, "python": PythonTool,
            "siirl.environment.tools.CalculatorTool": CalculatorTool,
            "siirl.environment.tools.PythonTool": PythonTool,
            # verl's own config files keep working for the sandbox tool
            "verl.tools.sandbox_fusion_tools.SandboxFusionTool": PythonTool}


def _class(name: str, where: str) -> Any:
    if name in BUILT_IN:
        return BUILT_IN[name]
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{where}: class_name {name!r} cannot be imported ({exc}); "
                          f"built-in tools: calculator, python") from None


def _text(result: Any) -> str:
    if inspect.isawaitable(result):
        result = asyncio.run(_awaited(result))
    if isinstance(result, tuple) and result:
        result = result[0]
    return str(getattr(result, "text", result) if result is not None else "")


async def _awaited(result: Any) -> Any:
    return await result


class ToolSet:
    """The tools of a run by name: their schemas for the chat template, and ``call``."""

    def __init__(self, tools: Sequence[Tool], max_response_chars: int = 256,
                 truncate_side: str = "middle"):
        self.tools = {tool.name: tool for tool in tools}
        self.max_chars, self.side = int(max_response_chars), str(truncate_side)

    @property
    def schemas(self) -> List[Dict[str, Any]]:
        return [tool.schema for tool in self.tools.values()]

    def instances(self, extra_info: Any = None) -> Optional[ToolInstances]:
        """One conversation's instances of verl-style stateful tools (None: there are none)."""
        if not any(is_stateful(tool) for tool in self.tools.values()):
            return None
        return ToolInstances(self.tools, extra_info)

    def call(self, call: ToolCall, instances: Optional[ToolInstances] = None) -> str:
        """The tool's answer, or its error text (never raises); a stateful tool answers
        through the conversation's ``instances``."""
        if call.error:
            text = f"error: {call.error}"
        elif call.name not in self.tools:
            text = f"error: no tool named {call.name!r}; tools: {', '.join(self.tools)}"
        else:
            try:
                tool = self.tools[call.name]
                if is_stateful(tool):
                    if instances is None:
                        raise RuntimeError("a stateful tool is called outside a conversation")
                    text = _text(instances.execute(call.name, dict(call.arguments)))
                else:
                    text = _text(tool.execute(dict(call.arguments)))
            except Exception as exc:  # a failing tool answers with its error
                text = f"error: {type(exc).__name__}: {exc}"
        return truncate(text, self.max_chars, self.side)[0]

    def call_many(self, calls: Sequence[ToolCall], threads: int = 4,
                  instances: Optional[Sequence[Optional[ToolInstances]]] = None) -> List[str]:
        """``call`` for each; ``instances``: the calling conversation's, per call."""
        owners = list(instances) if instances is not None else [None] * len(calls)
        if len(calls) <= 1 or threads <= 1:
            return [self.call(c, i) for c, i in zip(calls, owners, strict=True)]
        with ThreadPoolExecutor(max_workers=min(threads, len(calls))) as pool:
            return list(pool.map(self.call, calls, owners))


def _check_local_sandbox(config: Dict[str, Any], where: str) -> None:
    """A python tool that runs code here loads only where the sandbox contains it, or
    with ``allow_uncontained: true``: refused when the run starts, not at a call."""
    opt_out = config.get("allow_uncontained", False)
    if not isinstance(opt_out, bool):
        raise ConfigError(f"{where}: config.allow_uncontained must be true or false, got "
                          f"{opt_out!r}")
    if not config.get("sandbox_fusion_url") and not opt_out:
        require_isolation(where, "allow_uncontained: true in this tool's config")


def load_tools(path: Optional[str], sandbox_fusion: Optional[Dict[str, Any]] = None,
               max_response_chars: int = 256, truncate_side: str = "middle") -> ToolSet:
    """The tools of ``path`` (none without one); ``sandbox_fusion`` (``url``,
    ``max_concurrent``, ``memory_limit_mb``) is the default remote for python tools."""
    import yaml

    if not path:
        return ToolSet([], max_response_chars, truncate_side)
    where = f"rollout.multi_turn.tool_config_path={path}"
    try:
        with open(path) as handle:
            spec = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it ({exc})") from None
    tools: List[Tool] = []
    remote = dict(sandbox_fusion or {})
    for k, entry in enumerate(spec.get("tools") or []):
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ConfigError(f"{where}: tools[{k}] needs class_name, config, tool_schema")
        cls = _class(str(entry["class_name"]), f"{where}: tools[{k}]")
        config = dict(entry.get("config") or {})
        if cls is PythonTool and remote.get("url"):
            config.setdefault("sandbox_fusion_url", remote["url"])
            config.setdefault("max_concurrent", remote.get("max_concurrent", 64))
            config.setdefault("memory_limit_mb", remote.get("memory_limit_mb", 1024))
        if cls is PythonTool:
            _check_local_sandbox(config, f"{where}: tools[{k}]")
        schema = entry.get("tool_schema")
        if schema is not None and not (isinstance(schema, dict) and
                                       isinstance(schema.get("function", {}).get("name"), str)):
            raise ConfigError(f"{where}: tools[{k}].tool_schema must be an OpenAI function "
                              "schema {type: function, function: {name, description, "
                              "parameters}}")
        validate = getattr(cls, "validate_tool_schema", None)  # siiRL's BaseTool: a model
        tool = cls(config=config, tool_schema=validate(schema) if schema is not None and
                   callable(validate) else schema)
        if not getattr(tool, "schema", None):
            tool.schema = dict(schema or {})
        tool.name = getattr(tool, "name", "") or str(
            tool.schema.get("function", {}).get("name", ""))
        if not tool.name:
            raise ConfigError(f"{where}: tools[{k}] has no tool_schema.function.name")
        tools.append(tool)
    return ToolSet(tools, max_response_chars, truncate_side)
