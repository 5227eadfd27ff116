"""Tests for the built-in "repeat" task generator (response lengths with a long tail)."""

import collections
import runpy
import sys
import warnings

import pyarrow.parquet as pq
import pytest

from siirl.data_coordinator.tasks import TASK_NAMES, task_module
from siirl.data_coordinator.tasks.repeat import (
    ALPHABET,
    MAX_K,
    MAX_UNIT,
    SCHEMA,
    make_rows,
    make_splits,
    problem_space,
    problem_weights,
    write_parquet,
)
from siirl.errors import DataError


def _key(row):
    return row["extra_info"]["unit"], row["extra_info"]["k"]


def test_rows_are_correct_and_in_schema():
    rows = make_rows(500, seed=0)
    assert rows == make_rows(500, seed=0) and rows != make_rows(500, seed=1)
    for i, row in enumerate(rows):
        unit, k = _key(row)
        assert 1 <= len(unit) <= MAX_UNIT and set(unit) <= set(ALPHABET) and 1 <= k <= MAX_K
        assert row["data_source"] == "repeat"
        assert row["prompt"] == [{"role": "user", "content": f"{unit}*{k}="}]
        assert row["reward_model"] == {"style": "rule", "ground_truth": unit * k}
        assert row["extra_info"]["index"] == i and row["extra_info"]["split"] == "train"
    with pytest.raises(DataError):
        make_rows(-1)


def test_weights_are_a_distribution_with_a_long_tail():
    space = problem_space()
    assert len(space) == len(set(space)) == sum(4 ** n for n in range(1, 5)) * MAX_K
    weights = problem_weights(space)
    assert sum(weights) == pytest.approx(1.0)
    by_k = collections.Counter()
    for (_, k), w in zip(space, weights, strict=True):
        by_k[k] += w
    assert all(by_k[k] > by_k[k + 1] for k in range(1, MAX_K))  # fewer repetitions, likelier
    with pytest.raises(DataError):
        problem_weights(space, tail=-1.0)


def test_response_lengths_have_a_long_tail():
    train, _ = make_splits(2000, 200, seed=1)
    lengths = sorted(len(r["reward_model"]["ground_truth"]) for r in train)
    median, p90 = lengths[len(lengths) // 2], lengths[int(0.9 * len(lengths))]
    assert median <= 10 and p90 >= 2 * median and lengths[-1] >= 3 * p90 // 2
    # most answers are short; a few (but some) are 30-40 letters long
    assert lengths[-1] >= 30 and 0 < sum(n >= 30 for n in lengths) < len(lengths) // 10


def test_splits_disjoint_and_val_distinct():
    train, val = make_splits(2000, 200, seed=0)
    assert len(train) == 2000 and len(val) == 200
    val_keys = {_key(r) for r in val}
    assert len(val_keys) == 200 and {r["extra_info"]["split"] for r in val} == {"val"}
    assert not val_keys & {_key(r) for r in train}
    assert len({_key(r) for r in train}) > 500  # the space, not a handful of prompts
    with pytest.raises(DataError, match="distinct split"):
        make_splits(10, len(problem_space()), seed=0)


def test_parquet_schema_and_round_trip(tmp_path):
    rows = make_rows(20, seed=5)
    write_parquet(rows, tmp_path / "sub" / "r.parquet")
    table = pq.read_table(tmp_path / "sub" / "r.parquet")
    assert table.schema.equals(SCHEMA) and table.to_pylist() == rows


def test_task_names():
    assert TASK_NAMES[0] == "arithmetic" and "repeat" in TASK_NAMES
    assert task_module("repeat").DATA_SOURCE == "repeat"
    with pytest.raises(DataError, match="data.builtin_task"):
        task_module("nope")


def test_cli_module(tmp_path, monkeypatch):
    import siirl.data_coordinator as dc

    for name in ("siirl.data_coordinator.tasks", "siirl.data_coordinator.tasks.repeat"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(dc, "tasks", dc.tasks)
    monkeypatch.setattr(sys, "argv", ["repeat", "--out", str(tmp_path), "--train-size", "6",
                                      "--val-size", "3"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        runpy.run_module("siirl.data_coordinator.tasks.repeat", run_name="__main__")
    assert pq.read_table(tmp_path / "train.parquet").num_rows == 6
    assert pq.read_table(tmp_path / "val.parquet").num_rows == 3
