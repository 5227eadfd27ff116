"""A bad dataset names the file, the row and the column; an empty one names the file and
what emptied it (issue 16). Each case writes a tiny file under tmp_path."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from siirl.data_coordinator.dataloader import PartitionedDataset, StatefulDataLoader, read_rows
from siirl.data_coordinator.settings import DataArguments
from siirl.errors import DataError


class CharTokenizer:
    pad_token_id = 0

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]


class StrictTemplateTokenizer(CharTokenizer):
    """A chat template that, like many real ones, rejects roles it does not know."""

    chat_template = "strict"

    def apply_chat_template(self, messages, **kwargs):
        for m in messages:
            if m["role"] not in ("system", "user", "assistant"):
                raise ValueError(f"unknown role {m['role']}")
        return "".join(m["content"] for m in messages)


def row(content="1+1=", **change):
    base = {"data_source": "t", "prompt": [{"role": "user", "content": content}],
            "ability": "math", "reward_model": {"ground_truth": "2"}}
    base.update(change)
    return base


def lines(rows):
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def error_of(files, config=None, tokenizer=None):
    with pytest.raises(DataError) as info:
        PartitionedDataset(files, tokenizer or CharTokenizer(), config)
    return str(info.value)


def test_malformed_jsonl_row_names_file_row_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(lines([row(), "", row(), '{"data_source": "t", "prompt": [', row()]))
    message = error_of(str(path))
    assert str(path) in message and "row 2" in message and "line 4" in message
    assert "not valid JSON" in message


def test_not_utf8_names_file_row_and_byte(tmp_path):
    path = tmp_path / "train.jsonl"
    text = lines([row(), row(), json.dumps(row("arithm\u00e9tique"), ensure_ascii=False)])
    path.write_bytes(text.encode("latin-1"))
    message = error_of(str(path))
    assert str(path) in message and "row 2" in message and "line 3" in message
    assert "not UTF-8" in message and "byte" in message and "save the file as UTF-8" in message


def test_utf8_with_bom_and_line_separators_in_strings_read(tmp_path):
    path = tmp_path / "train.jsonl"
    text = lines([row("a\u2028b"), row("c")])  # U+2028 is valid inside a JSON string
    path.write_bytes(b"\xef\xbb\xbf" + text.replace("\\u2028", "\u2028").encode("utf-8"))
    rows = read_rows(str(path))
    assert [r["prompt"][0]["content"] for r in rows] == ["a\u2028b", "c"]


def test_json_array_error_names_line_and_column(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('[\n{"a": 1},\n{"a": }\n]')
    message = error_of(str(path))
    assert str(path) in message and "line 3" in message and "column" in message


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_row_without_the_prompt_column_names_it_and_the_columns_it_has(tmp_path, kind):
    other = {"question": "1+1=", "answer": "2"}
    path = tmp_path / f"train.{kind}"
    if kind == "jsonl":
        path.write_text(lines([row(), other]))
    else:  # one schema for the whole file: every row lacks the column
        pq.write_table(pa.Table.from_pylist([other, other]), path)
    message = error_of(str(path))
    row_no = 1 if kind == "jsonl" else 0
    assert str(path) in message and f"row {row_no}" in message and "'prompt'" in message
    assert "'question'" in message and "data.prompt_key" in message


@pytest.mark.parametrize("bad,column", [
    (row(prompt="1+1="), "prompt"),
    (row(prompt=[{"content": "1+1="}]), "role"),
    (row(data_source=7), "data_source"),
    (row(reward_model=7), "reward_model"),
    (row(reward_model={"style": "rule"}), "reward_model.ground_truth"),
])
def test_wrong_type_names_file_row_and_column(tmp_path, bad, column):
    path = tmp_path / "train.jsonl"
    path.write_text(lines([row(), row(), row(), bad]))
    message = error_of(str(path))
    assert str(path) in message and "row 3" in message and column in message


def test_chat_template_failure_names_the_row(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(lines([row(), row(prompt=[{"role": "robot", "content": "hi"}])]))
    message = error_of(str(path), tokenizer=StrictTemplateTokenizer())
    assert str(path) in message and "row 1" in message and "chat template" in message
    assert "unknown role robot" in message


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_an_empty_file_is_named(tmp_path, content):
    path = tmp_path / "train.jsonl"
    path.write_text(content)
    message = error_of(str(path))
    assert str(path) in message and "0 rows" in message and "empty" in message


def test_a_dataset_emptied_by_the_overlong_filter_names_file_filter_and_counts(tmp_path):
    long_rows, empty = tmp_path / "train.jsonl", tmp_path / "more.jsonl"
    long_rows.write_text(lines([row("x" * 10)] * 5))
    empty.write_text("")
    config = DataArguments(max_prompt_length=4, filter_overlong_prompts=True)
    message = error_of([str(long_rows), str(empty)], config)
    assert f"{long_rows}: 5 rows, 5 filtered" in message and f"{empty}: 0 rows" in message
    assert "data.filter_overlong_prompts=true" in message
    assert "data.max_prompt_length=4" in message


def test_an_overlong_prompt_without_the_filter_names_row_and_limit(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(lines([row("ab"), row("x" * 10)]))
    message = error_of(str(path), DataArguments(max_prompt_length=4))
    assert str(path) in message and "row 1" in message and "data.max_prompt_length=4" in message


def test_fewer_rows_than_a_batch_names_the_files_and_the_batch_size(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(lines([row("x" * 10), row(), row(), row()]))
    dataset = PartitionedDataset(str(path), CharTokenizer(),
                                 DataArguments(max_prompt_length=6, filter_overlong_prompts=True))
    with pytest.raises(DataError) as info:
        StatefulDataLoader(dataset, batch_size=8, pad_token_id=0, rank=0, num_ranks=2)
    message = str(info.value)
    assert f"{path}: 4 rows, 1 filtered" in message and "keeps 3 rows" in message
    assert "batch_size=8 x 2 ranks = 16" in message and "data.train_batch_size=16" in message


def test_a_folder_or_missing_file_is_named(tmp_path):
    assert "folder" in error_of(str(tmp_path))
    assert "not found" in error_of(str(tmp_path / "missing.parquet"))
