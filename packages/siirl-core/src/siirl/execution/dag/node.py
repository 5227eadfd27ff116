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


# agent_options a node may carry (siiRL's names), what each does:
AGENT_OPTIONS = {
    "process_path": "file with pre_process/post_process: the agent's prompt and hand-over",
    "pre_process_kwargs": "keywords for pre_process (e.g. pre_chat_template)",
    "post_process_kwargs": "keywords for post_process (e.g. post_chat_template)",
    "env_path": "['file.py:Class']: the environment stepped after this agent's turn",
    "obs_with_env": "pass the environment's latest observation to pre_process",
    "rewards_with_env": "score episodes with the environment's reward",
    "share_instance": "use another agent group's engine for this role (e.g. one critic)",
    "train_cycle": "agents take turns to train, this many steps each",
}


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
    # Multi-agent workflows (siiRL's MARFT files): which agent's engines the node uses, the
    # settings of that agent's engines (keys under actor_rollout_ref, e.g. "rollout.n"), and
    # per-agent options (AGENT_OPTIONS). One agent group (0) is an ordinary workflow.
    agent_group: int = 0
    config: Dict[str, Any] = field(default_factory=dict)
    agent_options: Dict[str, Any] = field(default_factory=dict)
    # The planner's: the node runs in training steps 1..until_step (critic warm-up) and in
    # the steps where train node ``while_waiting`` waits for its agent_options.train_cycle
    # turn only (both None: every step)
    until_step: Optional[int] = None
    while_waiting: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.node_id, str) or not self.node_id:
            raise PipelineError(f"node id must be a non-empty string, got {self.node_id!r}")
        self.node_type = _coerce_enum(NodeType, self.node_type, self.node_id, "node_type")
        self.node_role = _coerce_enum(NodeRole, self.node_role, self.node_id, "node_role")
        if isinstance(self.dependencies, str):
            self.dependencies = [self.dependencies]
        self.dependencies = list(self.dependencies or [])
        if self.node_type is NodeType.MODEL_TRAIN and self.node_role is NodeRole.REFERENCE:
            # the reference is never trained: siiRL's workflow files write its log-prob node
            # as MODEL_TRAIN, with or without only_forward_compute
            self.only_forward_compute = True
        if isinstance(self.agent_group, bool) or not isinstance(self.agent_group, int) or \
                self.agent_group < 0:
            raise PipelineError(f"node '{self.node_id}': agent_group must be an integer >= 0, "
                                f"got {self.agent_group!r}")
        for what in ("config", "agent_options"):
            value = getattr(self, what)
            if value is None:
                setattr(self, what, {})
            elif not isinstance(value, dict):
                raise PipelineError(f"node '{self.node_id}': {what} must be a mapping, got "
                                    f"{type(value).__name__}")
        unknown = sorted(set(self.agent_options) - set(AGENT_OPTIONS))
        if unknown:
            raise PipelineError(f"node '{self.node_id}': unknown agent_options {unknown}; "
                                f"allowed: {', '.join(AGENT_OPTIONS)}")
        share = self.agent_options.get("share_instance")
        if share is not None and (isinstance(share, bool) or not isinstance(share, int)
                                  or share < 0 or share == self.agent_group):
            raise PipelineError(f"node '{self.node_id}': agent_options.share_instance={share!r} "
                                "must name another agent group (an integer)")
        cycle = self.agent_options.get("train_cycle")
        if cycle is not None and (isinstance(cycle, bool) or not isinstance(cycle, int)
                                  or cycle < 1):
            raise PipelineError(f"node '{self.node_id}': agent_options.train_cycle={cycle!r} "
                                "must be an integer >= 1")

    def check_type_role(self) -> None:
        """Reject combinations that cannot be executed (e.g. training the reward)."""
        allowed = ALLOWED_ROLES[self.node_type]
        if self.node_role not in allowed:
            names = ", ".join(sorted(r.name for r in allowed))
            raise PipelineError(
                f"node '{self.node_id}': node_type {self.node_type.name} cannot have role "
                f"{self.node_role.name} (allowed: {names})"
            )

    def describe(self) -> str:
        deps = ", ".join(self.dependencies) or "-"
        target = self.executable_ref or getattr(self.executable, "__qualname__", "-")
        windows = ([f"steps 1-{self.until_step}"] if self.until_step is not None else []) + \
            ([f"steps where {self.while_waiting} waits for its train_cycle turn"]
             if self.while_waiting is not None else [])
        steps = f" ({' and '.join(windows)} only)" if windows else ""
        return (f"{self.node_id} [{self.node_type.name}/{self.node_role.name}] "
                f"<- {deps} : {target}{steps}")
