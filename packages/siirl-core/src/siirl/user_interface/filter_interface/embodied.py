"""Embodied sampling: keep task groups whose success rate is informative.

A group whose episodes all succeed or all fail teaches nothing under GRPO. With
``algorithm.embodied_sampling.filter_accuracy`` (default true) only groups whose mean
``complete`` (per-episode success, 0/1) lies within ``[accuracy_lower_bound,
accuracy_upper_bound]`` are kept. Each worker filters its own rows: no data moves.
"""

from __future__ import annotations

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.fields import COMPLETE
from siirl.execution.config_select import select
from siirl.user_interface.filter_interface.group_filter import filter_groups, row_values


def embodied_local_rank_sampling(batch, config=None, **kwargs) -> NodeOutput:
    prefix = "algorithm.embodied_sampling"
    lower = float(select(config, f"{prefix}.accuracy_lower_bound", 0.1))
    upper = float(select(config, f"{prefix}.accuracy_upper_bound", 0.9))
    metric = select(config, f"{prefix}.metric", COMPLETE)
    values = row_values(batch, metric)
    filtered, stats = filter_groups(
        batch, values, lambda group: lower <= float(group.float().mean()) <= upper)
    metrics = {f"embodied_sampling/{k.split('/')[-1]}": v for k, v in stats.items()}
    metrics["embodied_sampling/success_rate"] = float(values.float().mean()) \
        if values.numel() else 0.0
    if not select(config, f"{prefix}.filter_accuracy", True):
        return NodeOutput(batch=batch, metrics=metrics)
    return NodeOutput(batch=filtered, metrics=metrics)
