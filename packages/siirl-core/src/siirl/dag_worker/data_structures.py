"""Values passed between DAG nodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict


@dataclass
class NodeOutput:
    """What a node function returns.

    ``batch`` goes to the node's children (``None`` means "pass my input on unchanged");
    ``metrics`` are logged for the step under their own names; ``info`` is free-form data
    for the worker (it is not logged).
    """

    batch: Any
    metrics: Dict = None
    info: Dict = None

    def __post_init__(self):
        if self.metrics is None:
            self.metrics = {}
        if self.info is None:
            self.info = {}


@dataclass
class StepResult:
    """Everything one pass over the graph produced: exit nodes' outputs and step metrics."""

    outputs: Dict[str, NodeOutput] = field(default_factory=dict)
    metrics: Dict[str, float] = field(default_factory=dict)
