"""Cross-worker metric reduction: the reducer is picked from the metric's name."""

import math

import pytest

from siirl.execution.metric_worker import (
    DEFAULT_REDUCER,
    REDUCERS,
    reduce_metrics,
    reducer_for,
    weighted_mean,
)


@pytest.mark.parametrize("name, reducer", [
    ("response_length/max", "max"),
    ("critic/score/max", "max"),
    ("response_length/min", "min"),
    ("timing_s/gen", "max"),
    ("timing_s/step", "max"),
    ("perf/total_num_tokens", "sum"),
    ("rollout/tokens", "sum"),
    ("reward/errors", "sum"),
    ("reward/timeouts", "sum"),
    ("groups/count", "sum"),
    ("groups/total", "sum"),
    ("groups/kept", "sum"),
    ("perf/throughput", "sum"),
    ("rollout/tokens_per_s", "sum"),
    ("perf/gen_tokens_per_s", "sum"),
    ("actor/pg_loss", "mean"),
    ("critic/score/mean", "mean"),
    ("response_length/clip_ratio", "mean"),
    ("perf/max_memory_allocated_gb", "mean"),
    ("reward/errors_rate", "mean"),
    ("env/episodes", "sum"),
    ("val-env/episodes", "sum"),
    ("env/lost", "sum"),
    ("env/actions_clipped", "sum"),
    ("env/success_rate", "mean"),
])
def test_reducer_for(name, reducer):
    assert reducer_for(name) == reducer


@pytest.mark.parametrize("name, reducer", [
    ("timing_s/gen/min", "min"),   # an explicit suffix beats the timing_s/* rule
    ("timing_s/gen/max", "max"),
    ("timing_s/total", "max"),     # timing_s/* comes before the */total counter rule
    ("groups/count/max", "max"),   # suffix first: the largest per-worker count
])
def test_precedence_first_matching_row_wins(name, reducer):
    assert reducer_for(name) == reducer


def test_reducer_table_is_ordered_and_complete():
    patterns = [pattern for pattern, _ in REDUCERS]
    assert patterns[:3] == ["*/max", "*/min", "timing_s/*"]
    assert {reducer for _, reducer in REDUCERS} == {"max", "min", "sum"}
    assert DEFAULT_REDUCER == "mean"


def test_reduce_each_kind():
    workers = [
        {"timing_s/gen": 2.0, "len/max": 10, "len/min": 3, "rollout/tokens": 100,
         "perf/throughput": 50.0, "actor/loss": 1.0},
        {"timing_s/gen": 5.0, "len/max": 7, "len/min": 1, "rollout/tokens": 300,
         "perf/throughput": 70.0, "actor/loss": 3.0},
    ]
    assert reduce_metrics(workers) == {
        "timing_s/gen": 5.0, "len/max": 10.0, "len/min": 1.0, "rollout/tokens": 400.0,
        "perf/throughput": 120.0, "actor/loss": 2.0,
    }


def test_missing_metric_uses_the_workers_that_have_it():
    workers = [{"actor/loss": 1.0, "reward/errors": 2},
               {"actor/loss": 3.0},
               {"actor/loss": 5.0, "reward/errors": 1, "only/here": 7.0, "skipped": None}]
    out = reduce_metrics(workers)
    assert out == {"actor/loss": 3.0, "reward/errors": 3.0, "only/here": 7.0}
    assert list(out) == ["actor/loss", "reward/errors", "only/here"]


def test_single_worker_and_empty():
    assert reduce_metrics([{"a": 1.5, "timing_s/x": 2}]) == {"a": 1.5, "timing_s/x": 2.0}
    assert reduce_metrics([]) == {}
    assert reduce_metrics([{}, {}]) == {}


def test_weighted_mean():
    assert weighted_mean([1.0, 3.0], [3, 1]) == pytest.approx(1.5)
    assert weighted_mean([2.0], [0.5]) == 2.0
    with pytest.raises(ValueError, match="2 values but 1 weights"):
        weighted_mean([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="sum to zero"):
        weighted_mean([1.0], [0.0])
    with pytest.raises(ValueError, match="negative"):
        weighted_mean([1.0, 2.0], [1.0, -1.0])


def test_reduce_metrics_with_worker_weights_only_changes_means():
    workers = [{"loss": 1.0, "rollout/tokens": 10, "timing_s/x": 1.0},
               {"loss": 4.0, "rollout/tokens": 20, "timing_s/x": 3.0},
               {"rollout/tokens": 5}]
    out = reduce_metrics(workers, weights=[2, 1, 9])
    assert out["loss"] == pytest.approx(2.0)
    assert out["rollout/tokens"] == 35.0 and out["timing_s/x"] == 3.0
    with pytest.raises(ValueError, match="3 workers but 2 weights"):
        reduce_metrics(workers, weights=[1, 1])


def test_sum_is_exact_over_many_workers():
    out = reduce_metrics([{"x/count": 0.1} for _ in range(10)])
    assert math.isclose(out["x/count"], 1.0, rel_tol=0, abs_tol=1e-15)
