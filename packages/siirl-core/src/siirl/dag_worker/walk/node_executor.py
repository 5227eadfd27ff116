"""Call one node's function: bind it correctly, pass the arguments it accepts, time it."""

from __future__ import annotations

import contextlib
import inspect
import time
import traceback
from typing import Any, Callable, Dict

from siirl.dag_worker.data_structures import NodeOutput
from siirl.dag_worker.walk import activity
from siirl.errors import PipelineError, SiirlError
from siirl.execution.dag.func_ref import (
    FUNCTION,
    INSTANCE_METHOD,
    WORKER_METHOD,
    FuncTarget,
    resolve_ref,
)
from siirl.execution.dag.node import Node


class NodeExecutionError(SiirlError):
    """A node function raised; the message names the node and where it failed."""


def _target_for(node: Node) -> FuncTarget:
    """Classify the node's function; a plain callable whose path does not import is a function."""
    if node.executable_ref:
        try:
            target = resolve_ref(node.executable_ref, f"node '{node.node_id}'")
            if node.executable is None or target.func is node.executable:
                return target
        except PipelineError:
            if node.executable is None:
                raise
    return FuncTarget(node.executable, FUNCTION)


def _accepted_kwargs(func: Callable, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """Keep only the keyword arguments ``func`` can take (all of them with ``**kwargs``)."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return kwargs
    names = {p.name for p in params}
    return {key: value for key, value in kwargs.items() if key in names}


class NodeExecutor:
    """Per-worker cache of bound node callables.

    Extra keyword arguments given to every node: ``node`` (the Node) and ``worker`` (the
    executing DAGWorker); a function receives those its signature accepts.
    """

    def __init__(self, worker: Any):
        self.worker = worker
        self._bound: Dict[str, Callable] = {}
        self._instances: Dict[type, Any] = {}

    def _bind(self, node: Node) -> Callable:
        target = _target_for(node)
        if target.kind == WORKER_METHOD:
            return target.func.__get__(self.worker)
        if target.kind == INSTANCE_METHOD:
            if target.owner not in self._instances:
                try:
                    self._instances[target.owner] = target.owner()
                except TypeError as exc:
                    raise PipelineError(
                        f"node '{node.node_id}': '{node.executable_ref}' is an instance method "
                        f"and {target.owner.__name__}() cannot be built without arguments "
                        f"({exc}); use a function or a staticmethod") from exc
            return target.func.__get__(self._instances[target.owner])
        return target.func

    def callable_for(self, node: Node) -> Callable:
        if node.node_id not in self._bound:
            self._bound[node.node_id] = self._bind(node)
        return self._bound[node.node_id]

    def is_user_node(self, node: Node) -> bool:
        """Whether the node runs the user's code (a function defined outside siiRL, e.g. a
        custom pipeline's): its metrics are shown on the console's step line."""
        func = self.callable_for(node)
        func = getattr(func, "func", func)  # functools.partial
        module = getattr(func, "__module__", None) or ""
        return not (module == "siirl" or module.startswith("siirl."))

    def run(self, node: Node, batch: Any, config: Any) -> tuple:
        """Run ``node`` on ``batch``; return (NodeOutput, seconds)."""
        func = self.callable_for(node)
        kwargs = _accepted_kwargs(func, {"node": node, "worker": self.worker})
        profiler = getattr(self.worker, "profiler", None)
        traced = profiler.node(node.node_id, getattr(func, "__name__", None)) \
            if profiler is not None else contextlib.nullcontext()
        start = time.perf_counter()
        try:
            with activity.running(f"node '{node.node_id}'"), traced:
                output = func(batch, config=config, **kwargs)
        except SiirlError as exc:  # already user-facing: add which node it came from
            exc.args = (f"node '{node.node_id}': {exc}",) + exc.args[1:]
            raise
        except Exception as exc:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            raise NodeExecutionError(
                f"node '{node.node_id}' ({node.executable_ref}) raised "
                f"{type(exc).__name__}: {exc} [at {frame.filename}:{frame.lineno}]") from exc
        seconds = time.perf_counter() - start
        if not isinstance(output, NodeOutput):
            raise PipelineError(
                f"node '{node.node_id}' ({node.executable_ref}) returned "
                f"{type(output).__name__}; node functions must return NodeOutput(batch, metrics)")
        return output, seconds
