"""Collect one step's metrics from the nodes that ran, as plain floats."""

from __future__ import annotations

import numbers
from typing import Any, Dict, Set

TIMING_PREFIX = "timing_s/"


def to_scalar(name: str, value: Any) -> float:
    """Tensors, numpy values and numbers become floats; sequences are averaged."""
    if hasattr(value, "detach"):  # torch tensor
        value = value.detach().float()
        return float(value.mean().item()) if value.numel() != 1 else float(value.item())
    if hasattr(value, "item") and getattr(value, "size", 2) == 1:  # numpy scalar / 1-array
        return float(value.item())
    if isinstance(value, numbers.Number):
        return float(value)
    if isinstance(value, (list, tuple)) and value:
        return sum(to_scalar(name, v) for v in value) / len(value)
    raise TypeError(f"metric '{name}' has non-numeric value of type {type(value).__name__}")


class MetricsCollector:
    """Per-step metrics: each node's own metrics plus ``timing_s/<node_id>``; the names the
    user's own nodes log (``user_node``: a function outside siiRL) are kept across steps in
    ``custom_names``, for the console line."""

    def __init__(self):
        self._metrics: Dict[str, float] = {}
        self.custom_names: Set[str] = set()

    def reset(self) -> None:
        self._metrics = {}

    def add_node(self, node_id: str, metrics: Dict[str, Any], seconds: float,
                 user_node: bool = False) -> None:
        for name, value in (metrics or {}).items():
            self._metrics[name] = to_scalar(f"{node_id}:{name}", value)
        if user_node:
            self.custom_names.update(metrics or {})
        self._metrics[f"{TIMING_PREFIX}{node_id}"] = seconds

    def add(self, name: str, value: Any) -> None:
        self._metrics[name] = to_scalar(name, value)

    def accumulate(self, name: str, value: Any) -> None:
        """Add ``value`` to what ``name`` holds this step (e.g. a step that runs twice)."""
        self._metrics[name] = self._metrics.get(name, 0.0) + to_scalar(name, value)

    def result(self) -> Dict[str, float]:
        return dict(self._metrics)
