"""Resolve a node's function reference: ``"module:function"`` or ``"module:Class.method"``.

How a ``Class.method`` reference is called depends on the class:

- a class marked ``__siirl_worker__ = True`` (``DAGWorker`` and its subclasses): the method
  runs bound to the worker executing the graph, so ``"siirl.dag_worker.dagworker:
  DAGWorker.generate"`` uses that worker's engines;
- a ``staticmethod`` or ``classmethod``: called as is;
- any other instance method: the class is instantiated once per worker with no arguments
  and the method is bound to that instance.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

from siirl.errors import PipelineError

FUNCTION, STATIC, WORKER_METHOD, INSTANCE_METHOD = "function", "static", "worker", "instance"


@dataclass(frozen=True)
class FuncTarget:
    """A resolved reference: the callable and how it must be bound before a call."""

    func: Callable[..., Any]
    kind: str
    owner: Optional[type] = None


def _import_module(module_name: str, ref: str, where: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise PipelineError(
            f"{where}: cannot import module '{module_name}' for func '{ref}' "
            f"({exc})"
        ) from exc
    except Exception as exc:  # the module exists but fails while importing
        raise PipelineError(
            f"{where}: importing module '{module_name}' for func '{ref}' failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def resolve_ref(ref: str, where: str) -> FuncTarget:
    """Import ``ref`` and classify it. ``where`` prefixes errors (e.g. "node 'reward'"), which
    then name the module and attribute that failed."""
    if not isinstance(ref, str) or ref.count(":") != 1:
        raise PipelineError(
            f"{where}: func {ref!r} must look like 'module:function' or "
            "'module:Class.method'"
        )
    module_name, attr_path = ref.split(":")
    module = _import_module(module_name, ref, where)
    parts = attr_path.split(".")
    if len(parts) > 2 or not all(parts):
        raise PipelineError(f"{where}: func {ref!r} has a malformed attribute path")

    owner = None
    obj: Any = module
    for part in parts:
        if not hasattr(obj, part):
            kind = "class" if inspect.isclass(obj) else "object"
            holder = f"module '{module_name}'" if obj is module else \
                f"{kind} '{module_name}:{getattr(obj, '__name__', type(obj).__name__)}'"
            raise PipelineError(f"{where}: {holder} has no attribute '{part}' "
                                f"(func '{ref}')")
        if inspect.isclass(obj):
            owner = obj
        obj = getattr(obj, part)

    if owner is None:
        if inspect.isclass(obj) or not callable(obj):
            raise PipelineError(f"{where}: func '{ref}' is not a function")
        return FuncTarget(obj, FUNCTION)
    static = inspect.getattr_static(owner, parts[-1])
    if isinstance(static, (staticmethod, classmethod)):
        return FuncTarget(obj, STATIC, owner)
    if not inspect.isfunction(obj):
        raise PipelineError(f"{where}: func '{ref}' is not a method")
    kind = WORKER_METHOD if getattr(owner, "__siirl_worker__", False) else INSTANCE_METHOD
    return FuncTarget(obj, kind, owner)


def describe_callable(func: Callable[..., Any]) -> str:
    module = getattr(func, "__module__", "?")
    return f"{module}:{getattr(func, '__qualname__', repr(func))}"
