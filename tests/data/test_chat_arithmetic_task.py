"""The built-in "chat_arithmetic" task: the arithmetic task's problems asked in words."""

import pyarrow.parquet as pq

from siirl.data_coordinator.tasks import TASK_NAMES, arithmetic, chat_arithmetic, task_module


def _key(row):
    e = row["extra_info"]
    return e["a"], e["op"], e["b"]


def test_same_problems_as_arithmetic_asked_in_words():
    train, val = chat_arithmetic.make_splits(300, 50, seed=2)
    plain_train, plain_val = arithmetic.make_splits(300, 50, seed=2)
    assert [_key(r) for r in train] == [_key(r) for r in plain_train]
    assert [_key(r) for r in val] == [_key(r) for r in plain_val]
    assert not {_key(r) for r in val} & {_key(r) for r in train}
    for row, plain in zip(val, plain_val, strict=True):
        a, op, b = _key(row)
        assert row["prompt"] == [{"role": "user", "content":
                                  f"What is {a} {op} {b}? Answer with the number only."}]
        assert row["data_source"] == "chat_arithmetic"
        assert row["reward_model"] == plain["reward_model"]


def test_registered_and_written_in_the_arithmetic_schema(tmp_path):
    assert "chat_arithmetic" in TASK_NAMES and task_module("chat_arithmetic") is chat_arithmetic
    train, val = chat_arithmetic.make_splits(20, 5)
    chat_arithmetic.write_parquet(val, tmp_path / "val.parquet")
    table = pq.read_table(tmp_path / "val.parquet")
    assert table.schema == arithmetic.SCHEMA and table.to_pylist() == val
