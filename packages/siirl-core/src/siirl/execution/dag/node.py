"""A node of the training DAG: what runs, in which role, after which other nodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Dict, List, Optional

from siirl.errors import PipelineError


class NodeType(Enum):
    MODEL_INFERENCE = "model_inference"
    MODEL_TRAIN = "model_train"
    COMPUTE = "compute"
    DATA_LOAD = "data_load"


class NodeRole(Enum):
    ROLLOUT = "rollout"
    ACTOR = "actor"
    CRITIC = "critic"
    REFERENCE = "reference"
    REWARD = "reward"
    ADVANTAGE = "advantage"
    DYNAMIC_SAMPLING = "dynamic_sampling"
    DEFAULT = "default"


# Which roles make sense for each node type. A trained node needs trainable weights
# (actor or critic; the reference only forward, as siiRL's own YAML workflows write it);
# a compute node runs no model, so it cannot roll out; a data-load node only feeds the graph.
ALLOWED_ROLES: Dict[NodeType, frozenset] = {
    NodeType.MODEL_TRAIN: frozenset({NodeRole.ACTOR, NodeRole.CRITIC, NodeRole.REFERENCE}),
    NodeType.MODEL_INFERENCE: frozenset(
        {NodeRole.ROLLOUT, NodeRole.ACTOR, NodeRole.CRITIC, NodeRole.REFERENCE,
         NodeRole.REWARD, NodeRole.DEFAULT}
    ),
    NodeType.COMPUTE: frozenset(
        {NodeRole.REWARD, NodeRole.ADVANTAGE, NodeRole.DYNAMIC_SAMPLING, NodeRole.DEFAULT}
    ),
    NodeType.DATA_LOAD: frozenset({NodeRole.DEFAULT}),
}


def _coerce_enum(enum_cls, value, node_id: str, what: str):
    """Accept the enum itself, its value ("compute") or its name ("COMPUTE")."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        for member in enum_cls:
            if value.lower() in (member.value, member.name.lower()):
                return member
    names = ", ".join(m.name for m in enum_cls)
    raise PipelineError(f"node '{node_id}': {what} {value!r} is not one of {names}")


@dataclass
class Node:
    """One step of the workflow.

    ``executable_ref`` is the importable path (``"module:function"`` or
    ``"module:Class.method"``); ``executable`` is the resolved callable, filled in when
    the graph is built. A node built from a plain callable has both set.
    """

    node_id: str
    node_type: NodeType
    node_role: NodeRole = NodeRole.DEFAULT
    dependencies: List[str] = field(default_factory=list)
    executable: Optional[Callable[..., Any]] = None
    executable_ref: Optional[str] = None
    only_forward_compute: bool = False

    def __post_init__(self):
        if not isinstance(self.node_id, str) or not self.node_id:
            raise PipelineError(f"node id must be a non-empty string, got {self.node_id!r}")
        self.node_type = _coerce_enum(NodeType, self.node_type, self.node_id, "node_type")
        self.node_role = _coerce_enum(NodeRole, self.node_role, self.node_id, "node_role")
        if isinstance(self.dependencies, str):
            self.dependencies = [self.dependencies]
        self.dependencies = list(self.dependencies or [])

    def check_type_role(self) -> None:
        """Reject combinations that cannot be executed (e.g. training the reward)."""
        allowed = ALLOWED_ROLES[self.node_type]
        if self.node_role not in allowed:
            names = ", ".join(sorted(r.name for r in allowed))
            raise PipelineError(
                f"node '{self.node_id}': node_type {self.node_type.name} cannot have role "
                f"{self.node_role.name} (allowed: {names})"
            )
        if (self.node_type is NodeType.MODEL_TRAIN and self.node_role is NodeRole.REFERENCE
                and not self.only_forward_compute):
            raise PipelineError(
                f"node '{self.node_id}': the reference model is never trained; use node_type "
                "MODEL_INFERENCE (or MODEL_TRAIN with only_forward_compute: true)"
            )

    def describe(self) -> str:
        deps = ", ".join(self.dependencies) or "-"
        target = self.executable_ref or getattr(self.executable, "__qualname__", "-")
        return (f"{self.node_id} [{self.node_type.name}/{self.node_role.name}] "
                f"<- {deps} : {target}")
