"""The EMBODIED workflow (``algorithm.workflow_type=EMBODIED``), on the DAG core:

    rollout_actor -> embodied_sampling -> function_reward -> calculate_advantages
    -> actor_old_log_prob -> reference_log_prob -> actor_train

The rollout node plays episodes in embodied environments (``rollout_node``), one row per
episode; the sampling filter takes groups whose episodes all succeed or all fail out of
the loss; the ``embodied`` reward manager scores success (and SRPO's progress, with video
embeddings); group advantages compare the ``rollout.n`` episodes of one task and seed.
"""

from __future__ import annotations

from siirl.execution.dag.builtin_pipelines import STEPS, chain
from siirl.execution.dag.node import NodeRole, NodeType
from siirl.execution.dag.pipeline import Pipeline
from siirl.execution.dag.task_graph import TaskGraph

ROLLOUT = "siirl.environment.embodied.rollout_node:embodied_rollout"
_ROLLOUT = ("rollout_actor", ROLLOUT, NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT)


def embodied_pipeline() -> TaskGraph:
    return chain(Pipeline("embodied_grpo_training_pipeline",
                          "Embodied GRPO/SRPO: VLA episodes, task-success filtering before "
                          "reward"),
                 [_ROLLOUT, *(STEPS[name] for name in (
                     "embodied_sampling", "reward", "advantage", "old_log_prob",
                     "ref_log_prob", "train_actor"))])
