"""DAPO dynamic sampling: drop prompt groups whose metric has zero variance.

Such a group (all samples right, or all wrong) has zero GRPO advantage and only dilutes
the batch. ``algorithm.filter_groups.metric`` picks the value (default ``seq_final_reward``,
see ``group_filter.row_values``). With ``algorithm.filter_groups.enable=false`` the batch
passes through unchanged, metrics still reported.
"""

from __future__ import annotations

from siirl.dag_worker.data_structures import NodeOutput
from siirl.execution.config_select import select
from siirl.user_interface.filter_interface.group_filter import filter_groups, row_values


def _has_variance(group_values) -> bool:
    # A group of one sample carries no variance information; keep it, as verl does.
    return group_values.numel() == 1 or bool(group_values.std() > 0)


def dynamic_sampling(batch, config=None, **kwargs) -> NodeOutput:
    metric = select(config, "algorithm.filter_groups.metric", "seq_final_reward")
    filtered, stats = filter_groups(batch, row_values(batch, metric), _has_variance)
    metrics = {f"dynamic_sampling/{k.split('/')[-1]}": v for k, v in stats.items()}
    if not select(config, "algorithm.filter_groups.enable", False):
        return NodeOutput(batch=batch, metrics=metrics)
    return NodeOutput(batch=filtered, metrics=metrics)
