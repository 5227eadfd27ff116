"""Pipeline: the declarative builder users write workflows with; ``build()`` gives a TaskGraph."""

from __future__ import annotations

from typing import Callable, List, Optional, Union

from siirl.errors import PipelineError
from siirl.execution.dag.func_ref import describe_callable, resolve_ref
from siirl.execution.dag.node import Node, NodeRole, NodeType
from siirl.execution.dag.task_graph import TaskGraph

WORKER = "siirl.dag_worker.dagworker:DAGWorker"

# The DAGWorker method a node runs when it names no func, keyed by (type, role, forward only).
DEFAULT_FUNCS = {
    (NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT, False): f"{WORKER}.generate",
    (NodeType.COMPUTE, NodeRole.REWARD, False): f"{WORKER}.compute_reward",
    (NodeType.MODEL_INFERENCE, NodeRole.REWARD, False): f"{WORKER}.compute_reward",
    (NodeType.COMPUTE, NodeRole.ADVANTAGE, False): f"{WORKER}.compute_advantage",
    (NodeType.MODEL_INFERENCE, NodeRole.ACTOR, False): f"{WORKER}.compute_old_log_prob",
    (NodeType.MODEL_TRAIN, NodeRole.ACTOR, True): f"{WORKER}.compute_old_log_prob",
    (NodeType.MODEL_INFERENCE, NodeRole.REFERENCE, False): f"{WORKER}.compute_ref_log_prob",
    (NodeType.MODEL_TRAIN, NodeRole.REFERENCE, True): f"{WORKER}.compute_ref_log_prob",
    (NodeType.MODEL_INFERENCE, NodeRole.CRITIC, False): f"{WORKER}.compute_value",
    (NodeType.MODEL_TRAIN, NodeRole.CRITIC, True): f"{WORKER}.compute_value",
    (NodeType.MODEL_TRAIN, NodeRole.ACTOR, False): f"{WORKER}.train_actor",
    (NodeType.MODEL_TRAIN, NodeRole.CRITIC, False): f"{WORKER}.train_critic",
}


_ROLLOUT = (NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT, False)
MULTI_AGENT_ROLLOUT = "siirl.dag_worker.multi_agent.rollout:multi_agent_rollout"


def default_func_for(node: Node) -> Optional[str]:
    forward_only = node.only_forward_compute and node.node_type is NodeType.MODEL_TRAIN
    return DEFAULT_FUNCS.get((node.node_type, node.node_role, forward_only))


class Pipeline:
    """Chainable builder: ``Pipeline(id, description).add_node(...).add_node(...).build()``."""

    def __init__(self, pipeline_id: str, description: str = ""):
        self.pipeline_id = pipeline_id
        self.description = description
        self._nodes: dict = {}

    def add_node(
        self,
        node_id: str,
        func: Union[str, Callable, None] = None,
        deps: Optional[List[str]] = None,
        node_type: Union[NodeType, str] = NodeType.COMPUTE,
        node_role: Union[NodeRole, str] = NodeRole.DEFAULT,
        only_forward_compute: bool = False,
        agent_group: int = 0,
        config: Optional[dict] = None,
        agent_options: Optional[dict] = None,
    ) -> Pipeline:
        """Add a node; ``func`` is ``"module:function"``, ``"module:Class.method"`` or a
        callable. Without ``func`` the DAGWorker method for the node's type and role is used
        (``DEFAULT_FUNCS``). ``agent_group``/``config``/``agent_options``: multi-agent
        workflows (see ``node.AGENT_OPTIONS``)."""
        if node_id in self._nodes:
            raise PipelineError(f"pipeline '{self.pipeline_id}': duplicate node id '{node_id}'")
        deps = [deps] if isinstance(deps, str) else list(deps or [])
        node = Node(node_id, node_type, node_role, deps,
                    only_forward_compute=bool(only_forward_compute), agent_group=agent_group,
                    config=dict(config or {}), agent_options=dict(agent_options or {}))
        if func is None:
            func = default_func_for(node)
            if func is None:
                raise PipelineError(
                    f"node '{node_id}' has no func and there is no built-in function for "
                    f"{node.node_type.name}/{node.node_role.name}; pass func='module:function'")
        if callable(func):
            node.executable, node.executable_ref = func, describe_callable(func)
        elif isinstance(func, str):
            node.executable_ref = func
        else:
            raise PipelineError(f"node '{node_id}': func must be a string or a callable, "
                                f"got {type(func).__name__}")
        self._nodes[node_id] = node
        return self

    def build(self) -> TaskGraph:
        """Resolve every function reference, validate the DAG and return it."""
        graph = TaskGraph(self.pipeline_id, self.description)
        multi_agent = len({node.agent_group for node in self._nodes.values()}) > 1
        for node in self._nodes.values():
            if multi_agent and node.executable_ref == DEFAULT_FUNCS[_ROLLOUT]:
                # agents' rollout nodes play their turns together, episode by episode
                node.executable, node.executable_ref = None, MULTI_AGENT_ROLLOUT
            if node.executable is None:
                node.executable = resolve_ref(node.executable_ref, f"node '{node.node_id}'").func
            graph.add_node(node)
        graph.validate_graph()
        return graph

    def __repr__(self) -> str:
        return f"Pipeline({self.pipeline_id!r}, nodes={list(self._nodes)})"
