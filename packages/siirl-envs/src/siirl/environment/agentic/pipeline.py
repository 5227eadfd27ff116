"""The AGENTIC workflow (``algorithm.workflow_type=AGENTIC``), on the DAG core:

    agentic_rollout -> advantage -> old_log -> ref_log -> train

The rollout node plays whole episodes (``rollout_node``) and puts each episode's reward on
its last agent token; group advantages (``algorithm.adv_estimator``, grpo by default) then
compare the ``rollout.n`` episodes that started from one seed.
"""

from __future__ import annotations

from siirl.execution.dag.node import NodeRole, NodeType
from siirl.execution.dag.pipeline import WORKER, Pipeline
from siirl.execution.dag.task_graph import TaskGraph

ROLLOUT = "siirl.environment.agentic.rollout_node:agentic_rollout"


def agentic_pipeline() -> TaskGraph:
    pipeline = Pipeline("agentic_training_pipeline",
                        "AGENTIC: multi-turn episodes in environments, group advantages")
    steps = [
        ("agentic_rollout", ROLLOUT, NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT),
        ("calculate_advantages", f"{WORKER}.compute_advantage", NodeType.COMPUTE,
         NodeRole.ADVANTAGE),
        ("actor_old_log_prob", f"{WORKER}.compute_old_log_prob", NodeType.MODEL_INFERENCE,
         NodeRole.ACTOR),
        ("reference_log_prob", f"{WORKER}.compute_ref_log_prob", NodeType.MODEL_INFERENCE,
         NodeRole.REFERENCE),
        ("actor_train", f"{WORKER}.train_actor", NodeType.MODEL_TRAIN, NodeRole.ACTOR),
    ]
    previous = None
    for node_id, func, node_type, node_role in steps:
        pipeline.add_node(node_id, func=func, deps=[previous] if previous else [],
                          node_type=node_type, node_role=node_role)
        previous = node_id
    return pipeline.build()
