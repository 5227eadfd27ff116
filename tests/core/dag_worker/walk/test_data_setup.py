"""data.builtin_task picks the built-in task written when data files are unset."""

import pyarrow.parquet as pq
import pytest

from siirl.dag_worker.walk.data_setup import BUILTIN_VAL_SIZE, resolve_data_files
from siirl.params.parser import parse_config
from siirl.params.typed import to_typed
from siirl.params.validation import value_problems


def _config(run_dir, **data):
    return to_typed({"data": data, "trainer": {"default_local_dir": str(run_dir)}})


def _sources(path):
    return set(pq.read_table(path, columns=["data_source"]).column(0).to_pylist())


def test_default_is_arithmetic_in_its_old_file_names(tmp_path):
    train, val = resolve_data_files(_config(tmp_path))
    assert (train, val) == (str(tmp_path / "data" / "train.parquet"),
                            str(tmp_path / "data" / "val.parquet"))
    assert _sources(train) == _sources(val) == {"arithmetic"}


def test_switching_the_task_in_one_run_dir_writes_its_own_files(tmp_path):
    arith = resolve_data_files(_config(tmp_path))
    train, val = resolve_data_files(_config(tmp_path, builtin_task="repeat"))
    assert {train, val}.isdisjoint(arith)
    assert _sources(train) == _sources(val) == {"repeat"}
    assert pq.read_table(val).num_rows == BUILTIN_VAL_SIZE
    assert _sources(resolve_data_files(_config(tmp_path))[0]) == {"arithmetic"}


def test_given_files_win_and_only_the_missing_one_is_built_in(tmp_path):
    config = _config(tmp_path, builtin_task="repeat", train_files="mine.parquet")
    train, val = resolve_data_files(config)
    assert train == "mine.parquet" and _sources(val) == {"repeat"}
    both = _config(tmp_path / "b", train_files="a.parquet", val_files="b.parquet")
    assert resolve_data_files(both) == ("a.parquet", "b.parquet")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("value, ok", [("repeat", True), ("arithmetic", True), ("gsm8k", False)])
def test_the_key_is_one_of_the_task_names(value, ok):
    config = to_typed(parse_config([f"data.builtin_task={value}"], check_support=False))
    problems = [p for p in value_problems(config) if p.startswith("data.builtin_task")]
    assert problems == ([] if ok else ["data.builtin_task='gsm8k': must be one of: arithmetic, "
                                       "repeat, chat_arithmetic"])


def test_the_key_costs_a_notice_when_both_files_are_given():
    from siirl.params.key_support import rule_for

    given = ["data.train_files=a.parquet", "data.val_files=b.parquet"]
    config = parse_config(["data.builtin_task=repeat", *given], check_support=False)
    assert rule_for("data.builtin_task", config) is not None
    half = parse_config(["data.builtin_task=repeat", given[0]], check_support=False)
    assert rule_for("data.builtin_task", half) is None
