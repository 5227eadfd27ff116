"""Helpers for moving batches along DAG edges."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List

from siirl.errors import PipelineError


def merge_parent_batches(node_id: str, batches: List[Any]) -> Any:
    """Combine the batches of a node's parents, in the order of its ``dependencies``.

    TensorDict batches (same batch size) are unioned field by field; where two parents
    carry the same field, the parent listed later wins. Plain dicts merge the same way.
    """
    from siirl.data_coordinator.protocol import merge  # TensorDict only needed here

    present = [b for b in batches if b is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    if all(isinstance(b, dict) for b in present):
        merged: Dict = {}
        for b in present:
            merged.update(b)
        return merged
    try:
        return merge(present)
    except Exception as exc:
        raise PipelineError(f"node '{node_id}': cannot merge its parents' batches: {exc}") \
            from exc


def call_with_available(fn: Callable, sources: Dict[str, Any], what: str) -> Any:
    """Call ``fn`` with the arguments its signature names, taken from ``sources``.

    Required parameters missing from ``sources`` raise a PipelineError naming them; optional
    ones keep their defaults. This lets one registry hold functions with different inputs
    (GRPO needs ``index``, GAE needs ``values``) without per-name branches.
    """
    kwargs, missing = {}, []
    for name, param in inspect.signature(fn).parameters.items():
        if name in sources and sources[name] is not None:
            kwargs[name] = sources[name]
        elif param.default is inspect.Parameter.empty and param.kind not in (
                param.VAR_KEYWORD, param.VAR_POSITIONAL):
            missing.append(name)
    if missing:
        raise PipelineError(f"{what} needs {', '.join(missing)}, which the batch does not carry")
    return fn(**kwargs)
