"""Embodied sampling: train only on task groups whose success rate is informative.

A group whose episodes all succeed or all fail teaches nothing under GRPO. With
``algorithm.embodied_sampling.filter_accuracy`` (default true) only groups whose mean
``complete`` (per-episode success, 0/1) lies within ``[accuracy_lower_bound,
accuracy_upper_bound]`` are trained on. The others stay in the batch with their response
mask set to 0, so they add nothing to the loss: every worker keeps its row count (the
workers' updates pair up collective by collective) and a step where no group qualifies
trains on nothing instead of failing. Each worker filters its own rows: no data moves.
"""

from __future__ import annotations

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.dag_worker.nodes.group_filter import row_values
from siirl.data_coordinator.fields import RESPONSE_MASK
from siirl.data_coordinator.protocol import group_indices
from siirl.params.typed import to_typed


def embodied_local_rank_sampling(batch, config=None, **kwargs) -> NodeOutput:
    settings = to_typed(config).algorithm.embodied_sampling  # a dict or None when alone
    lower, upper = settings.accuracy_lower_bound, settings.accuracy_upper_bound
    metric = settings.metric
    values = row_values(batch, metric)
    groups = group_indices(batch)
    dropped = [rows for rows in groups.values()
               if not lower <= float(values[rows].float().mean()) <= upper]
    kept = len(groups) - len(dropped)
    metrics = {"embodied_sampling/total": float(len(groups)),
               "embodied_sampling/kept": float(kept),
               "embodied_sampling/kept_ratio": kept / max(len(groups), 1),
               "embodied_sampling/success_rate": float(values.float().mean())
               if values.numel() else 0.0}
    if not settings.filter_accuracy or not dropped:
        return NodeOutput(batch=batch, metrics=metrics)
    if RESPONSE_MASK not in batch.keys():
        return NodeOutput(batch=batch, metrics=metrics)  # nothing trains on these rows
    out = batch.clone(recurse=False)
    mask = out[RESPONSE_MASK].clone()
    rows = torch.tensor([row for group in dropped for row in group], dtype=torch.long)
    mask[rows] = 0
    out.set(RESPONSE_MASK, mask)
    return NodeOutput(batch=out, metrics=metrics)
