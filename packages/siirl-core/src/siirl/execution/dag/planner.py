"""The planner: what of a workflow runs, in which order, with which weight syncs.

``plan_graph(graph, config)`` turns a loaded workflow (built-in, ``dag.custom_pipeline_fn``
or a YAML workflow) into the graph the workers walk. It decides by node role, for the
nodes that run siiRL's own functions for that role (``DAGWorker.compute_old_log_prob``,
``compute_ref_log_prob``, ``train_actor``, the rollout); a node running the user's own
function is the user's and is planned as written. ``--print-dag`` prints the result.

* Reference: planned only where a KL term reads ``ref_log_prob``
  (``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward``, per agent group); else left out.
* Old log-probs: left out where the actor's update computes them bit for bit as its first
  forward (the actor engine plugin's ``old_log_probs_from_update(config, workers)``: one
  epoch over one mini-batch, no shuffle, the same micro-batches), unless something reads
  them before the update (KL in the reward). With ``trainer.critic_warmup=k`` the actor
  does not train in steps 1..k, so there the node runs (``until_step``). In a multi-agent
  workflow each agent group is asked with its own settings (its nodes' ``config:``), where
  its one update follows its old-log-prob node and its actor is not shared; where that
  update waits for its ``agent_options.train_cycle`` turn the node runs (``while_waiting``).
* KL in the reward: the old-log-prob and reference nodes that the workflow puts after the
  advantage node are moved before it, which applies the penalty with them (a workflow
  without them gets them added there).
* Weight sync: a step before every rollout node (a loaded checkpoint, or a rollout that
  starts without the policy's weights) and after every node that trains the actor; it hands
  the actor's weights to the rollout when their versions differ (``timing_s/weight_sync``).

A node left out is removed with its edges re-joined (its children depend on its parents);
``graph.left_out`` keeps each one's reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from siirl.errors import ConfigError, PipelineError, PluginNotFoundError
from siirl.execution.dag.agent_config import group_config
from siirl.execution.dag.node import Node, NodeRole, NodeType
from siirl.execution.dag.pipeline import WORKER
from siirl.execution.dag.task_graph import TaskGraph

OLD_LOG_PROB_FN = "DAGWorker.compute_old_log_prob"
REF_LOG_PROB_FN = "DAGWorker.compute_ref_log_prob"
TRAIN_ACTOR_FN = "DAGWorker.train_actor"
ADVANTAGE_FN = "DAGWorker.compute_advantage"


@dataclass(frozen=True)
class WeightSyncStep:
    """The actor -> rollout weight sync (of every agent group), run ``where`` ("before" or
    "after") node ``node_id``."""

    where: str
    node_id: str
    reason: str

    def describe(self) -> str:
        return f"weight_sync (actor -> rollout) {self.where} {self.node_id}: {self.reason}"


@dataclass(frozen=True)
class LeftOut:
    """Why the planner left a node (of agent group ``agent_group``) out."""

    reason: str
    agent_group: int = 0


def _runs(node: Node, qualname: str) -> bool:
    """Whether ``node`` runs siiRL's own ``qualname`` (by reference or by function)."""
    ref = node.executable_ref or ""
    func = node.executable
    return ref.endswith(":" + qualname) or \
        getattr(func, "__qualname__", None) == qualname and \
        (getattr(func, "__module__", "") or "").startswith("siirl.")


def is_old_log_prob(node: Node) -> bool:
    return node.node_role is NodeRole.ACTOR and _runs(node, OLD_LOG_PROB_FN)


def is_reference(node: Node) -> bool:
    return node.node_role is NodeRole.REFERENCE and _runs(node, REF_LOG_PROB_FN)


def trains_actor(node: Node) -> bool:
    return node.node_role is NodeRole.ACTOR and node.node_type is NodeType.MODEL_TRAIN and \
        not node.only_forward_compute


def _typed(config: Any) -> Any:
    from siirl.params.typed import to_typed

    return to_typed(config)


def kl_terms(config: Any, node_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    """The KL terms that read the reference's log-probs: ``actor.use_kl_loss`` (an agent's
    node ``config`` may set it, ``node_settings``) and ``algorithm.use_kl_in_reward``."""
    cfg = _typed(config)
    use_kl_loss = (node_settings or {}).get("actor.use_kl_loss",
                                            cfg.actor_rollout_ref.actor.use_kl_loss)
    terms = ["actor_rollout_ref.actor.use_kl_loss"] if use_kl_loss else []
    if cfg.algorithm.use_kl_in_reward:
        terms.append("algorithm.use_kl_in_reward")
    return terms


def reference_needed(config: Any) -> bool:
    """Whether a KL term reads ``ref_log_prob`` (then the reference is planned and built)."""
    return bool(kl_terms(config))


def _group_settings(graph: TaskGraph, group: int) -> Dict[str, Any]:
    settings: Dict[str, Any] = {}
    for node in graph.nodes.values():
        if node.agent_group == group:
            settings.update(node.config or {})
    return settings


def _on_policy_update(cfg: Any, workers: int) -> bool:
    """The actor engine plugin's answer (False when it gives none or is not installed:
    then the node runs and the mistake, if any, is reported when the engine is built)."""
    from siirl.plugins import load_plugin

    try:
        factory = load_plugin("siirl.engines", str(cfg.actor_rollout_ref.actor.strategy))
    except PluginNotFoundError:
        return False
    decide = getattr(factory, "old_log_probs_from_update", None)
    try:
        return bool(decide(cfg, workers)) if decide is not None else False
    except ConfigError:  # a bad batch setting: the engine names it when it is built
        return False


ON_POLICY_REASON = ("on-policy update (ppo_epochs=1, one mini-batch per step, no shuffle, the "
                    "log-prob pass's micro-batches): the actor's update takes the old "
                    "log-probs from its own first forward, bit for bit")


def _siirl_updates(graph: TaskGraph, group: int) -> List[Node]:
    return [n for n in graph.nodes.values() if n.agent_group == group and trains_actor(n)
            and _runs(n, TRAIN_ACTOR_FN)]


def _agent_on_policy(graph: TaskGraph, cfg: Any, workers: int, group: int) -> bool:
    """Whether agent ``group``'s update computes its old log-probs bit for bit as its first
    forward: its one update of siiRL's own follows each of its old-log-prob nodes, its actor
    is its own (with ``share_instance`` another agent's update could change the weights in
    between), and the actor engine plugin says so for the agent's settings."""
    updates = _siirl_updates(graph, group)
    if len(updates) != 1:
        return False
    for node in graph.nodes.values():
        share = node.agent_options.get("share_instance")
        if share is not None and node.node_role in (NodeRole.ACTOR, NodeRole.ROLLOUT) and \
                group in (node.agent_group, share):
            return False
        if node.agent_group == group and is_old_log_prob(node) and \
                updates[0].node_id not in _descendants(graph, node.node_id):
            return False
    try:
        agent_cfg = group_config(cfg, [n for n in graph.nodes.values()
                                       if n.agent_group == group], group)
    except PipelineError:  # the worker names the setting when it builds the agent's engines
        return False
    return _on_policy_update(agent_cfg, workers)


BYPASS_REASON = ("algorithm.rollout_correction.bypass_mode=true: the actor's update takes "
                 "the rollout's log-probs (rollout_log_probs) as the old log-probs")


def _rollout_log_probs_are_old(cfg: Any) -> bool:
    """verl's bypass mode: the update reads the rollout's log-probs instead (only where a
    siiRL update of the actor is there to read them)."""
    return bool(cfg.algorithm.rollout_correction.bypass_mode)


def _old_log_prob_decision(graph: TaskGraph, cfg: Any, workers: int) -> Dict[int, str]:
    """The agent groups whose old-log-prob nodes are left out, with the reason."""
    if cfg.algorithm.use_kl_in_reward:
        return {}  # the KL penalty reads them before the update
    groups = sorted({node.agent_group for node in graph.nodes.values()})
    if _rollout_log_probs_are_old(cfg) and any(_siirl_updates(graph, g) for g in groups):
        return {group: BYPASS_REASON for group in groups if _siirl_updates(graph, group)}
    if len(groups) > 1:  # each agent's update has its own settings
        return {group: ON_POLICY_REASON for group in groups
                if _agent_on_policy(graph, cfg, workers, group)}
    if not any(trains_actor(n) and _runs(n, TRAIN_ACTOR_FN) for n in graph.nodes.values()):
        return {}  # no update of siiRL's own in this workflow to take them over
    if not _on_policy_update(cfg, workers):
        return {}
    return {group: ON_POLICY_REASON for group in groups}


def _in_steps(graph: TaskGraph, node: Node, warmup: int) -> str:
    """Plan old-log-prob ``node`` for the steps where its agent's actor does not train (it
    logs the policy's entropy there): the ``trainer.critic_warmup`` steps, and the steps
    where the update waits for its ``agent_options.train_cycle`` turn (multi-agent); the
    words that say in which steps it is left out."""
    words = []
    if warmup > 0:
        node.until_step = warmup
        words.append(f"from step {warmup + 1} (after trainer.critic_warmup={warmup})")
    update = _siirl_updates(graph, node.agent_group)
    cycle = update[0].agent_options.get("train_cycle") if len(update) == 1 and \
        len({n.agent_group for n in graph.nodes.values()}) > 1 else None
    if cycle:
        node.while_waiting = update[0].node_id
        words.append(f"in the steps where {update[0].node_id} trains "
                     f"(agent_options.train_cycle={cycle})")
    return ", ".join(words) + ": " if words else ""


def _without(graph: TaskGraph, node_id: str) -> None:
    """Remove ``node_id``; its children depend on its parents instead."""
    removed = graph.nodes.pop(node_id)
    for node in graph.nodes.values():
        if node_id in node.dependencies:
            deps: List[str] = []
            for dep in node.dependencies:
                for new in (removed.dependencies if dep == node_id else [dep]):
                    if new not in deps:
                        deps.append(new)
            node.dependencies = deps


def _descendants(graph: TaskGraph, node_id: str) -> set:
    graph.build_adjacency_lists()
    seen, todo = set(), [node_id]
    while todo:
        for child in graph.adj[todo.pop()]:
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def _missing_log_prob_nodes(graph: TaskGraph, adv: Node, moving: List[Node]
                            ) -> Dict[str, Node]:
    """The old-log-prob and reference nodes a workflow with KL in the reward lacks, added
    (as siiRL's own, in the advantage node's agent group)."""
    added: Dict[str, Node] = {}
    for node_id, present, role, qualname in (
            ("actor_old_log_prob", is_old_log_prob, NodeRole.ACTOR, OLD_LOG_PROB_FN),
            ("reference_log_prob", is_reference, NodeRole.REFERENCE, REF_LOG_PROB_FN)):
        if any(present(node) for node in [*graph.nodes.values(), *moving]):
            continue
        while node_id in graph.nodes or any(node.node_id == node_id for node in moving):
            node_id = f"{node_id}_planned"
        added[node_id] = Node(node_id, NodeType.MODEL_INFERENCE, role,
                              agent_group=adv.agent_group,
                              executable_ref=f"{WORKER.rsplit(':', 1)[0]}:{qualname}")
    return added


def _log_probs_before_advantage(graph: TaskGraph) -> None:
    """KL in the reward: the log-prob nodes after an advantage node move to just before
    it; those the workflow lacks are added there."""
    for adv in [n for n in graph.nodes.values() if n.node_role is NodeRole.ADVANTAGE]:
        later = _descendants(graph, adv.node_id)
        movers = [n for n in graph.get_execution_order()
                  if n in later and (is_old_log_prob(graph.nodes[n])
                                     or is_reference(graph.nodes[n]))]
        moved = {node_id: graph.nodes[node_id] for node_id in movers}
        for node_id in movers:
            _without(graph, node_id)
        if _runs(adv, ADVANTAGE_FN):  # it applies the penalty: it reads both log-probs
            moved.update(_missing_log_prob_nodes(graph, adv, list(moved.values())))
        if not moved:
            continue
        previous = list(adv.dependencies)
        for node in moved.values():
            node.dependencies, previous = previous, [node.node_id]
        adv.dependencies = previous
        order = {}
        for node_id, node in graph.nodes.items():  # listed in running order, for ties
            if node_id == adv.node_id:
                order.update(moved)
            order[node_id] = node
        graph.nodes = order


def _weight_syncs(graph: TaskGraph) -> List[WeightSyncStep]:
    steps = []
    for node_id in graph.get_execution_order():
        node = graph.nodes[node_id]
        if node.node_role is NodeRole.ROLLOUT:
            steps.append(WeightSyncStep("before", node_id, "when a loaded checkpoint or a "
                                        "rollout without the policy's weights left them "
                                        "apart"))
        elif trains_actor(node):
            steps.append(WeightSyncStep("after", node_id, "the update changed the actor's "
                                        "weights (every rollout.model_update_frequency-th "
                                        "update)"))
    return steps


def plan_graph(graph: TaskGraph, config: Any, workers: int = 1) -> TaskGraph:
    """The planned copy of ``graph`` for a run of ``config`` on ``workers`` workers."""
    if graph.planned:
        return graph
    cfg = _typed(config)
    planned = graph.copy()
    left_out: Dict[str, LeftOut] = {}
    for node in list(planned.nodes.values()):
        if is_reference(node) and not kl_terms(cfg, _group_settings(planned,
                                                                    node.agent_group)):
            left_out[node.node_id] = LeftOut("no KL term reads ref_log_prob "
                                             "(actor_rollout_ref.actor.use_kl_loss and "
                                             "algorithm.use_kl_in_reward are false)",
                                             node.agent_group)
    reasons = _old_log_prob_decision(planned, cfg, workers)
    warmup = int(cfg.trainer.critic_warmup or 0)
    for node in list(planned.nodes.values()):
        reason = reasons.get(node.agent_group)
        if reason and is_old_log_prob(node):
            left_out[node.node_id] = LeftOut(_in_steps(planned, node, warmup) + reason,
                                             node.agent_group)
    for node_id in left_out:
        node = planned.nodes[node_id]
        if node.until_step is None and node.while_waiting is None:
            _without(planned, node_id)
    if cfg.algorithm.use_kl_in_reward:
        _log_probs_before_advantage(planned)
    planned.validate_graph()
    planned.left_out = left_out
    planned.weight_syncs = _weight_syncs(planned)
    planned.planned = True
    return planned
