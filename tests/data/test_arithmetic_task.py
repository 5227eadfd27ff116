"""Tests for the built-in "arithmetic" task generator."""

import json
import runpy
import sys
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from siirl.data_coordinator.dataloader import PartitionedDataset
from siirl.data_coordinator.tasks import make_rows, make_splits, problem_space, write_jsonl
from siirl.data_coordinator.tasks.arithmetic import SCHEMA, main, write_parquet
from siirl.errors import DataError


def _key(row):
    e = row["extra_info"]
    return e["a"], e["op"], e["b"]


def test_deterministic():
    assert make_rows(50, seed=3) == make_rows(50, seed=3)
    assert make_rows(50, seed=3) != make_rows(50, seed=4)
    assert make_rows(0, seed=1) == []


def test_rows_are_correct_and_in_schema():
    rows = make_rows(300, seed=0)
    for i, row in enumerate(rows):
        a, op, b = _key(row)
        assert row["data_source"] == "arithmetic" and row["ability"] == "math"
        assert row["prompt"] == [{"role": "user", "content": f"{a}{op}{b}="}]
        answer = a + b if op == "+" else a - b
        assert answer >= 0 and 0 <= a <= 20 and 0 <= b <= 20
        assert row["reward_model"] == {"style": "rule", "ground_truth": str(answer)}
        assert row["extra_info"]["index"] == i and row["extra_info"]["split"] == "train"
    assert {_key(r)[1] for r in rows} == {"+", "-"}


def test_range_ops_and_distinctness():
    space = problem_space(0, 20)
    assert len(space) == 21 * 21 + 21 * 22 // 2
    rows = make_rows(100, seed=1, low=5, high=9, ops=("-",), split="val")
    assert all(5 <= _key(r)[0] <= 9 and _key(r)[1] == "-" for r in rows)
    assert {r["extra_info"]["split"] for r in rows} == {"val"}
    few = make_rows(len(space), seed=2)
    assert len({_key(r) for r in few}) == len(space)  # no repeats until the space is used
    with pytest.raises(DataError):
        problem_space(5, 2)
    with pytest.raises(DataError):
        make_rows(3, ops=("*",))


def test_splits_disjoint():
    train, val = make_splits(2000, 200, seed=0)
    assert len(train) == 2000 and len(val) == 200
    val_keys = {_key(r) for r in val}
    assert len(val_keys) == 200
    assert not val_keys & {_key(r) for r in train}
    # a space too small for disjointness: train falls back to the whole space
    train, val = make_splits(10, 50, seed=0, low=0, high=3)
    assert len(train) == 10 and len(val) == 50


def test_parquet_schema_and_round_trip(tmp_path):
    rows = make_rows(20, seed=5)
    write_parquet(rows, tmp_path / "sub" / "a.parquet")
    table = pq.read_table(tmp_path / "sub" / "a.parquet")
    assert table.schema.equals(SCHEMA)
    assert pa.types.is_struct(table.schema.field("reward_model").type)
    assert pa.types.is_struct(table.schema.field("extra_info").type)
    assert table.to_pylist() == rows


def test_jsonl_round_trip(tmp_path):
    rows = make_rows(7, seed=5)
    write_jsonl(rows, tmp_path / "a.jsonl")
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == rows


class _Tok:
    pad_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_cli_main(tmp_path, capsys):
    main(["--out", str(tmp_path), "--train-size", "40", "--val-size", "8", "--seed", "1"])
    assert "wrote 40 train and 8 val rows" in capsys.readouterr().out
    train = PartitionedDataset(str(tmp_path / "train.parquet"), _Tok())
    val = PartitionedDataset(str(tmp_path / "val.parquet"), _Tok())
    assert (len(train), len(val)) == (40, 8)
    assert train[0]["ground_truth"] == str(eval(train[0]["prompt_text"].rstrip("=")))
    assert val[0]["extra_info"]["split"] == "val"


def test_cli_module(tmp_path, monkeypatch):
    # in-process `python -m`: the tasks package must not import the module itself
    # (runpy warns then); a subprocess would spend seconds importing torch
    import siirl.data_coordinator as dc

    for name in ("siirl.data_coordinator.tasks", "siirl.data_coordinator.tasks.arithmetic"):
        monkeypatch.delitem(sys.modules, name)  # restored after the test
    monkeypatch.setattr(dc, "tasks", dc.tasks)  # the re-import rebinds it; restore it too
    monkeypatch.setattr(sys, "argv", ["arithmetic", "--out", str(tmp_path),
                                      "--train-size", "5", "--val-size", "3"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        runpy.run_module("siirl.data_coordinator.tasks.arithmetic", run_name="__main__")
    assert pq.read_table(tmp_path / "val.parquet").num_rows == 3
