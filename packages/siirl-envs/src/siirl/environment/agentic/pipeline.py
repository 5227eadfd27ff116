"""The AGENTIC workflows (``algorithm.workflow_type=AGENTIC``), on the DAG core:

    agentic      agentic_rollout -> advantage -> old_log -> ref_log -> train_actor
    agentic_ppo  agentic_rollout -> critic_value -> advantage -> old_log -> ref_log
                 -> train_actor -> train_critic     (algorithm.adv_estimator=gae)

The rollout node plays whole episodes (``rollout_node``) and puts each episode's reward on
its last agent token; group advantages (grpo by default) compare the ``rollout.n`` episodes
that started from one seed, GAE uses the critic's values (``trainer.critic_warmup`` holds
the actor back for its first steps, as in PPO).
"""

from __future__ import annotations

from siirl.execution.dag.node import NodeRole, NodeType
from siirl.execution.dag.pipeline import WORKER, Pipeline
from siirl.execution.dag.task_graph import TaskGraph

ROLLOUT = "siirl.environment.agentic.rollout_node:agentic_rollout"
_INFER, _TRAIN, _COMPUTE = NodeType.MODEL_INFERENCE, NodeType.MODEL_TRAIN, NodeType.COMPUTE
_ROLLOUT = ("agentic_rollout", ROLLOUT, _INFER, NodeRole.ROLLOUT)
_VALUE = ("critic_value", f"{WORKER}.compute_value", _INFER, NodeRole.CRITIC)
_ADVANTAGE = ("calculate_advantages", f"{WORKER}.compute_advantage", _COMPUTE,
              NodeRole.ADVANTAGE)
_OLD_LOG = ("actor_old_log_prob", f"{WORKER}.compute_old_log_prob", _INFER, NodeRole.ACTOR)
_REF_LOG = ("reference_log_prob", f"{WORKER}.compute_ref_log_prob", _INFER,
            NodeRole.REFERENCE)
_TRAIN_ACTOR = ("actor_train", f"{WORKER}.train_actor", _TRAIN, NodeRole.ACTOR)
_TRAIN_CRITIC = ("critic_train", f"{WORKER}.train_critic", _TRAIN, NodeRole.CRITIC)


def _chain(pipeline: Pipeline, steps) -> TaskGraph:
    previous = None
    for node_id, func, node_type, node_role in steps:
        pipeline.add_node(node_id, func=func, deps=[previous] if previous else [],
                          node_type=node_type, node_role=node_role)
        previous = node_id
    return pipeline.build()


def agentic_pipeline() -> TaskGraph:
    return _chain(Pipeline("agentic_training_pipeline",
                           "AGENTIC: multi-turn episodes in environments, group advantages"),
                  [_ROLLOUT, _ADVANTAGE, _OLD_LOG, _REF_LOG, _TRAIN_ACTOR])


def agentic_ppo_pipeline() -> TaskGraph:
    return _chain(Pipeline("agentic_ppo_training_pipeline",
                           "AGENTIC with a critic: multi-turn episodes, GAE"),
                  [_ROLLOUT, _VALUE, _ADVANTAGE, _OLD_LOG, _REF_LOG, _TRAIN_ACTOR,
                   _TRAIN_CRITIC])
