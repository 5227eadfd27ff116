"""The built-in GRPO chain with a node that records the batch's fields before training.

Used by test_fields.py through ``dag.custom_pipeline_fn`` (pytest puts this directory on
sys.path; the subprocess gets it through PYTHONPATH).
"""

import json
from pathlib import Path

from tensordict.utils import is_non_tensor

from siirl.dag_worker.data_structures import NodeOutput
from siirl.execution.dag.builtin_pipelines import grpo_pipeline
from siirl.execution.dag.node import NodeRole, NodeType
from siirl.execution.dag.pipeline import Pipeline

RECORD = "batch_fields.json"


def record_fields(batch, config=None, **kwargs):
    """Write ``{field: "tensor" | "non-tensor"}`` of the batch that reaches actor_train."""
    kinds = {key: "non-tensor" if is_non_tensor(batch.get(key)) else "tensor"
             for key in batch.keys()}  # noqa: SIM118 (iterating a TensorDict gives rows)
    directory = Path(config.trainer.default_local_dir)
    (directory / RECORD).write_text(json.dumps(kinds, sort_keys=True))
    return NodeOutput(batch=batch)


def grpo_with_recorder():
    """GRPO's nodes in order, with ``record_fields`` between ref_log_prob and actor_train."""
    builtin = grpo_pipeline()
    pipeline = Pipeline("grpo_recording_fields", "GRPO, recording the trained batch's fields")
    previous = None
    for node in (builtin.nodes[i] for i in builtin.get_execution_order()):
        if node.node_type == NodeType.MODEL_TRAIN:
            pipeline.add_node("record_fields", func=record_fields, deps=[previous],
                              node_type=NodeType.COMPUTE, node_role=NodeRole.DEFAULT)
            previous = "record_fields"
        pipeline.add_node(node.node_id, func=node.executable_ref, deps=[previous] if previous
                          else [], node_type=node.node_type, node_role=node.node_role,
                          only_forward_compute=node.only_forward_compute)
        previous = node.node_id
    return pipeline.build()
