"""Combine one step's metrics from N workers into one value per metric.

Each worker reports ``{name: float}`` for its own data shard. How the N values of one
metric combine depends on what it measures, and that is read from its name: the first
matching row of ``REDUCERS`` (shell-style patterns, ``*`` also matches ``/``) wins, and a
name no row matches is averaged. Explicit ``/max`` and ``/min`` suffixes come first, so
``timing_s/gen/min`` is a min, while any other ``timing_s/*`` is a max (the slowest worker
bounds the step). Counters and throughputs add up over workers.
"""

from __future__ import annotations

import math
from fnmatch import fnmatchcase
from typing import Callable, Dict, List, Optional, Sequence, Tuple

MEAN, MAX, MIN, SUM = "mean", "max", "min", "sum"

# (pattern, reducer), first match wins; no match -> mean.
REDUCERS: Tuple[Tuple[str, str], ...] = (
    ("*/max", MAX),
    ("*/min", MIN),
    ("timing_s/*", MAX),
    ("perf/total_num_tokens", SUM),
    ("rollout/tokens", SUM),
    ("reward/errors", SUM),
    ("reward/errors/*", SUM),
    ("reward/samples", SUM),
    ("reward/retried", SUM),
    ("reward/timeouts", SUM),
    ("env/errors/*", SUM),  # agentic episodes: failures and format errors are counts
    ("*/format_errors", SUM),
    ("*env/episodes", SUM),  # embodied episodes: how many were played, lost, clipped
    ("*env/lost", SUM),
    ("*env/actions_clipped", SUM),
    ("multi_turn/tool_errors", SUM),
    ("*/count", SUM),
    ("*/total", SUM),
    ("*/kept", SUM),
    ("perf/throughput", SUM),
    ("async/stale_dropped", SUM),  # asynchronous training: each trainer's own counts
    ("async/queue_depth", SUM),
    ("async/groups_filtered", SUM),
    ("*tokens_per_s", SUM),
    ("databuffer/*/bytes_sent", SUM),
    ("databuffer/*/shared_bytes", SUM),
)
DEFAULT_REDUCER = MEAN


def weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """``sum(v * w) / sum(w)``; weights must be non-negative and not all zero."""
    if len(values) != len(weights):
        raise ValueError(f"weighted_mean: {len(values)} values but {len(weights)} weights")
    if any(w < 0 for w in weights):
        raise ValueError(f"weighted_mean: negative weight in {list(weights)}")
    total = math.fsum(weights)
    if total <= 0:
        raise ValueError("weighted_mean: the weights sum to zero")
    return math.fsum(v * w for v, w in zip(values, weights, strict=True)) / total


def _mean(values: List[float], weights: Optional[List[float]]) -> float:
    if weights is None:
        return math.fsum(values) / len(values)
    return weighted_mean(values, weights)


REDUCE_FUNCS: Dict[str, Callable[[List[float], Optional[List[float]]], float]] = {
    MEAN: _mean,
    MAX: lambda values, _weights: max(values),
    MIN: lambda values, _weights: min(values),
    SUM: lambda values, _weights: math.fsum(values),
}


def reducer_for(name: str) -> str:
    """The reducer ("mean" | "max" | "min" | "sum") used for metric ``name``."""
    for pattern, reducer in REDUCERS:
        if fnmatchcase(name, pattern):
            return reducer
    return DEFAULT_REDUCER


def reduce_metrics(per_worker: Sequence[Dict[str, float]],
                   weights: Optional[Sequence[float]] = None) -> Dict[str, float]:
    """One value per metric name over all workers' dicts.

    A metric missing (or ``None``) on some workers is reduced over those that have it.
    ``weights`` (one per worker, e.g. its batch size) turns means into weighted means;
    sums, maxima and minima ignore it. Names keep their order of first appearance.
    """
    if weights is not None and len(weights) != len(per_worker):
        raise ValueError(f"reduce_metrics: {len(per_worker)} workers but "
                         f"{len(weights)} weights")
    collected: Dict[str, Tuple[List[float], List[float]]] = {}
    for index, metrics in enumerate(per_worker):
        for name, value in (metrics or {}).items():
            if value is None:
                continue
            values, worker_weights = collected.setdefault(name, ([], []))
            values.append(float(value))
            worker_weights.append(1.0 if weights is None else float(weights[index]))
    return {name: REDUCE_FUNCS[reducer_for(name)](values,
                                                  None if weights is None else worker_weights)
            for name, (values, worker_weights) in collected.items()}
