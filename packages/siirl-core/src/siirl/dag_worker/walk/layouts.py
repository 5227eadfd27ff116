"""Where each node's rows live: the data-parallel layout of every node of a graph.

A node that runs a model has the layout of its engine: the rollout groups
``actor_rollout_ref.rollout.tensor_model_parallel_size`` consecutive workers into one
tensor-parallel group that reads the same rows; an actor/reference or critic on a backend
whose config section gives a model-parallel group (``ConfigSection.model_parallel``: a
megatron one's tensor x pipeline x context parallel peers, consecutive ranks as megatron
orders them) groups those peers; the other nodes of those roles (fsdp) are data parallel, one
row share per worker, or with Ulysses sequence parallelism (``ulysses_sequence_parallel_size``
s) per group of s consecutive workers, which split each sequence between them.
Every other node (reward, advantage, filters, custom functions) works where its first
parent's rows are.
Between a parent and a child with different layouts the DAGWorker's DataBuffer moves the
rows; between equal layouts they stay in place.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Callable, Dict, Optional, Sequence

from siirl.data_coordinator.data_buffer import Layout
from siirl.errors import ConfigError
from siirl.execution.dag.node import NodeRole
from siirl.execution.dag.task_graph import TaskGraph
from siirl.params.sections import section_selected_by

# node role -> config key of the model-parallel size whose peers share rows
_MODEL_PARALLEL_KEYS = {
    NodeRole.ROLLOUT: "actor_rollout_ref.rollout.tensor_model_parallel_size",
}
_DATA_PARALLEL_ROLES = (NodeRole.ACTOR, NodeRole.REFERENCE, NodeRole.CRITIC)
# node role -> the key picking its backend (the reference runs in the actor's parallel state)
_STRATEGY_KEYS = {
    NodeRole.ACTOR: "actor_rollout_ref.actor.strategy",
    NodeRole.REFERENCE: "actor_rollout_ref.actor.strategy",
    NodeRole.CRITIC: "critic.strategy",
}
# node role -> the Ulysses size key of its FSDP engine (the reference runs in the actor's)
_ULYSSES_KEYS = {
    NodeRole.ACTOR: "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    NodeRole.REFERENCE: "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    NodeRole.CRITIC: "critic.ulysses_sequence_parallel_size",
}


def sequence_parallel_sizes(config: Any) -> tuple:
    """The Ulysses group sizes above 1 that the FSDP engines of ``config`` use."""
    sizes = set()
    for role in (NodeRole.ACTOR, NodeRole.CRITIC):
        if _backend_group(role, config) is None:
            sizes.add(int(attrgetter(_ULYSSES_KEYS[role])(config) or 1))
    return tuple(sorted(s for s in sizes if s > 1))


def _backend_group(role: NodeRole, config: Any) -> Optional[tuple]:
    """(size, keys) of the model-parallel group the backend of ``role`` lays rows out over
    (its section's ``model_parallel``), or None: data parallel (with Ulysses groups)."""
    section = section_selected_by(_STRATEGY_KEYS[role], config) \
        if role in _STRATEGY_KEYS else None
    if section is None or section.model_parallel is None:
        return None
    return section.model_parallel(config) or 1, section.model_parallel_keys


def _model_parallel(role: NodeRole, config: Any) -> tuple:
    """(size, config key) of the group of workers that read the same rows at this node: the
    model-parallel peers of an actor/reference/critic's backend (a megatron one's TP x PP x
    CP, all sharing the actor's parallel state), the rollout's tensor-parallel peers, else 1
    (or the Ulysses group)."""
    group = _backend_group(role, config)
    if group is not None:
        return group
    key = _MODEL_PARALLEL_KEYS.get(role) or _ULYSSES_KEYS.get(role)
    return (int(attrgetter(key)(config) or 1) if key else 1), key


def _role_layout(role: NodeRole, config: Any, ranks: Sequence[int]) -> Layout:
    size, key = _model_parallel(role, config)
    # the validation pass refuses a size that does not divide all the workers before
    # anything loads (siirl.params.constraints); a graph run by some of them meets it here
    if size < 1 or len(ranks) % size:
        raise ConfigError(f"{key}={size} must divide the number of workers running the graph "
                          f"({len(ranks)})")
    return Layout(tuple(ranks), size)


def node_layouts(graph: TaskGraph, config: Any, ranks: Sequence[int],
                 config_for: Optional[Callable[[Any], Any]] = None) -> Dict[str, Layout]:
    """Layout of every node (in execution order) for a graph run by global ``ranks``;
    ``config_for(node)``: the settings of the node's engines (its agent group's), if not
    ``config``."""
    plain = Layout(tuple(ranks), 1)
    layouts: Dict[str, Layout] = {}
    for node_id in graph.get_execution_order():
        node = graph.nodes[node_id]
        if node.node_role in _MODEL_PARALLEL_KEYS or node.node_role in _DATA_PARALLEL_ROLES:
            own = config_for(node) if config_for is not None else config
            layouts[node_id] = _role_layout(node.node_role, own, ranks)
        elif node.dependencies:
            layouts[node_id] = layouts[node.dependencies[0]]
        else:
            layouts[node_id] = plain
    return layouts


def entry_layout(graph: TaskGraph, layouts: Dict[str, Layout]) -> Layout:
    """The layout the dataloader feeds: that of the first node in execution order."""
    return layouts[graph.get_execution_order()[0]]
