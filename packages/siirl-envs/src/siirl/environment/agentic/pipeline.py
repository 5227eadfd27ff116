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

from siirl.execution.dag.builtin_pipelines import STEPS, chain
from siirl.execution.dag.node import NodeRole, NodeType
from siirl.execution.dag.pipeline import Pipeline
from siirl.execution.dag.task_graph import TaskGraph

ROLLOUT = "siirl.environment.agentic.rollout_node:agentic_rollout"
_ROLLOUT = ("agentic_rollout", ROLLOUT, NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT)


def agentic_pipeline() -> TaskGraph:
    return chain(Pipeline("agentic_training_pipeline",
                          "AGENTIC: multi-turn episodes in environments, group advantages"),
                 [_ROLLOUT, *(STEPS[name] for name in ("advantage", "old_log_prob",
                                                        "ref_log_prob", "train_actor"))])


def agentic_ppo_pipeline() -> TaskGraph:
    return chain(Pipeline("agentic_ppo_training_pipeline",
                          "AGENTIC with a critic: multi-turn episodes, GAE"),
                 [_ROLLOUT, *(STEPS[name] for name in ("critic_value", "advantage",
                                                        "old_log_prob", "ref_log_prob",
                                                        "train_actor", "train_critic"))])
