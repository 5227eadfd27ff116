"""Cross-worker metric aggregation: one value per metric from every worker's step metrics."""

from siirl.execution.metric_worker.aggregation import (
    DEFAULT_REDUCER,
    REDUCERS,
    reduce_metrics,
    reducer_for,
    weighted_mean,
)

__all__ = ["DEFAULT_REDUCER", "REDUCERS", "reduce_metrics", "reducer_for", "weighted_mean"]
