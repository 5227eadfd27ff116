"""The built-in workflows, each a function returning a validated TaskGraph.

Flows (spec, "Built-in Pipelines Comparison"):
  GRPO      rollout -> reward -> advantage -> old_log -> ref_log -> train
  PPO       rollout -> reward -> value -> advantage -> old_log -> ref_log
            -> train_actor -> train_critic
  DAPO      rollout -> reward -> dynamic_sampling -> advantage -> old_log -> ref_log -> train
  ReMax     greedy_rollout -> greedy_reward -> rollout -> reward -> advantage -> old_log
            -> ref_log -> train (the greedy reply's score is each prompt's baseline)
  Embodied  rollout -> embodied_sampling -> reward -> advantage -> old_log -> ref_log -> train
            (registered by siirl-envs, whose rollout node plays the environments)

These are the spec's flows; the planner (``planner.plan_graph``) decides what of them runs
and ``--print-dag`` shows it: old_log and ref_log are "left out: <reason>" where the
on-policy update or the absence of a KL term makes them unneeded, with KL in the reward
they run before the advantage node, and weight-sync steps sit around rollout and training.
"""

from __future__ import annotations

from siirl.execution.dag.node import NodeRole, NodeType
from siirl.execution.dag.pipeline import WORKER, Pipeline
from siirl.execution.dag.task_graph import TaskGraph

_INFER, _TRAIN, _COMPUTE = NodeType.MODEL_INFERENCE, NodeType.MODEL_TRAIN, NodeType.COMPUTE
DAPO_FILTER = "siirl.dag_worker.nodes.dapo_filter:dynamic_sampling"
EMBODIED_FILTER = "siirl.dag_worker.nodes.embodied_filter:embodied_local_rank_sampling"


def chain(pipeline: Pipeline, steps) -> TaskGraph:
    """Add ``steps`` ``(node_id, func, node_type, node_role)`` as a linear chain: each node
    depends on the one before it (plugins build their workflows with it too)."""
    previous = None
    for node_id, func, node_type, node_role in steps:
        pipeline.add_node(node_id, func=func, deps=[previous] if previous else [],
                          node_type=node_type, node_role=node_role)
        previous = node_id
    return pipeline.build()


_ROLLOUT = ("rollout_actor", f"{WORKER}.generate", _INFER, NodeRole.ROLLOUT)
_REWARD = ("function_reward", f"{WORKER}.compute_reward", _COMPUTE, NodeRole.REWARD)
_ADVANTAGE = ("calculate_advantages", f"{WORKER}.compute_advantage", _COMPUTE,
              NodeRole.ADVANTAGE)
_OLD_LOG = ("actor_old_log_prob", f"{WORKER}.compute_old_log_prob", _INFER, NodeRole.ACTOR)
_REF_LOG = ("reference_log_prob", f"{WORKER}.compute_ref_log_prob", _INFER,
            NodeRole.REFERENCE)
_TRAIN_ACTOR = ("actor_train", f"{WORKER}.train_actor", _TRAIN, NodeRole.ACTOR)
_VALUE = ("critic_value", f"{WORKER}.compute_value", _INFER, NodeRole.CRITIC)
_TRAIN_CRITIC = ("critic_train", f"{WORKER}.train_critic", _TRAIN, NodeRole.CRITIC)
_GREEDY_ROLLOUT = ("rollout_greedy_baseline", f"{WORKER}.generate_greedy_baseline", _INFER,
                   NodeRole.ROLLOUT)
_GREEDY_REWARD = ("reward_greedy_baseline", f"{WORKER}.compute_reward_baseline", _COMPUTE,
                  NodeRole.REWARD)
_DAPO_FILTER = ("dynamic_sampling", DAPO_FILTER, _COMPUTE, NodeRole.DYNAMIC_SAMPLING)
_EMBODIED_FILTER = ("embodied_sampling", EMBODIED_FILTER, _COMPUTE, NodeRole.DYNAMIC_SAMPLING)
# the worker's own nodes, for workflows that reuse them: name -> (node_id, func, type, role)
STEPS = {"reward": _REWARD, "advantage": _ADVANTAGE, "old_log_prob": _OLD_LOG,
         "ref_log_prob": _REF_LOG, "train_actor": _TRAIN_ACTOR, "critic_value": _VALUE,
         "train_critic": _TRAIN_CRITIC, "embodied_sampling": _EMBODIED_FILTER}


def grpo_pipeline() -> TaskGraph:
    return chain(Pipeline("grpo_training_pipeline", "GRPO: group-normalised outcome reward"),
                  [_ROLLOUT, _REWARD, _ADVANTAGE, _OLD_LOG, _REF_LOG, _TRAIN_ACTOR])


def ppo_pipeline() -> TaskGraph:
    return chain(Pipeline("ppo_training_pipeline", "PPO: critic values and GAE"),
                  [_ROLLOUT, _REWARD, _VALUE, _ADVANTAGE, _OLD_LOG, _REF_LOG, _TRAIN_ACTOR,
                   _TRAIN_CRITIC])


def dapo_pipeline() -> TaskGraph:
    return chain(Pipeline("dapo_training_pipeline",
                           "DAPO: GRPO with zero-variance groups filtered out"),
                  [_ROLLOUT, _REWARD, _DAPO_FILTER, _ADVANTAGE, _OLD_LOG, _REF_LOG,
                   _TRAIN_ACTOR])


def remax_pipeline() -> TaskGraph:
    return chain(Pipeline("remax_training_pipeline",
                           "ReMax: sampled score minus the prompt's greedy-reply score"),
                  [_GREEDY_ROLLOUT, _GREEDY_REWARD, _ROLLOUT, _REWARD, _ADVANTAGE, _OLD_LOG,
                   _REF_LOG, _TRAIN_ACTOR])
