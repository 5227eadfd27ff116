"""Tests for siirl.data_coordinator.dataloader.PartitionedDataset (no downloads)."""

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from siirl.data_coordinator.dataloader import PartitionedDataset
from siirl.data_coordinator.settings import DataArguments
from siirl.data_coordinator.tasks.arithmetic import make_rows, write_jsonl, write_parquet
from siirl.errors import ConfigError, DataError


class CharTokenizer:
    """One token per character (its code point); no chat template."""

    pad_token_id = 0
    eos_token_id = 1

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]


class TemplateTokenizer(CharTokenizer):
    chat_template = "{% fake %}"

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, **kw):
        assert tokenize is False
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


class CallableTokenizer:
    """Has only ``__call__`` (HF style), no ``encode``."""

    pad_token_id = 0
    eos_token_id = 1
    chat_template = ""  # empty: must be treated as "no template"

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}


def _row(content, gt="1", **extra):
    return {"data_source": "t", "prompt": [{"role": "user", "content": content}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": gt},
            "extra_info": {"k": 1, **extra}}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_parquet_items(tmp_path):
    rows = make_rows(6, seed=0)
    write_parquet(rows, tmp_path / "a.parquet")
    ds = PartitionedDataset(str(tmp_path / "a.parquet"), CharTokenizer())
    assert len(ds) == 6 and ds.num_filtered == 0
    for i in range(6):
        item, row = ds[i], rows[i]
        assert item["index"] == i
        assert item["prompt_text"] == row["prompt"][0]["content"]
        assert item["input_ids"].dtype == torch.long and item["input_ids"].dim() == 1
        assert item["input_ids"].tolist() == [ord(c) for c in item["prompt_text"]]
        assert item["raw_prompt"] == row["prompt"]
        assert item["ground_truth"] == row["reward_model"]["ground_truth"]
        assert item["extra_info"] == row["extra_info"] and isinstance(item["extra_info"], dict)
        assert (item["data_source"], item["ability"]) == ("arithmetic", "math")


def test_jsonl_and_json_array_match_parquet(tmp_path):
    rows = make_rows(5, seed=1)
    write_parquet(rows, tmp_path / "a.parquet")
    write_jsonl(rows, tmp_path / "a.jsonl")
    (tmp_path / "a.json").write_text(json.dumps(rows))
    tok = CharTokenizer()
    sets = [PartitionedDataset(str(tmp_path / n), tok) for n in ("a.parquet", "a.jsonl",
                                                                     "a.json")]
    for i in range(5):
        a, b, c = (s[i] for s in sets)
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["input_ids"],
                                                                           c["input_ids"])
        for key in ("raw_prompt", "prompt_text", "ground_truth", "extra_info", "index"):
            assert a[key] == b[key] == c[key]


def test_chat_template_and_plain_join(tmp_path):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2="}]
    row = {**_row("x"), "prompt": msgs}
    path = _jsonl(tmp_path / "c.jsonl", [row])
    templ = PartitionedDataset(path, TemplateTokenizer())[0]
    assert templ["prompt_text"] == "<system>be brief<user>2+2=<assistant>"
    assert templ["input_ids"].tolist() == [ord(c) for c in templ["prompt_text"]]
    plain = PartitionedDataset(path, CharTokenizer())[0]
    assert plain["prompt_text"] == "be brief\n2+2="
    called = PartitionedDataset(path, CallableTokenizer())[0]
    assert called["prompt_text"] == "be brief\n2+2="
    assert torch.equal(called["input_ids"], plain["input_ids"])


def test_several_files_tilde_and_global_index(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write_parquet(make_rows(3, seed=0), tmp_path / "a.parquet")
    _jsonl(tmp_path / "b.jsonl", [_row("hello"), _row("world")])
    ds = PartitionedDataset(["~/a.parquet", "~/b.jsonl"], CharTokenizer())
    assert [ds[i]["index"] for i in range(len(ds))] == [0, 1, 2, 3, 4]
    assert ds[4]["prompt_text"] == "world"


def test_filter_overlong(tmp_path, caplog):
    cfg = DataArguments(max_prompt_length=4, filter_overlong_prompts=True)
    texts = ["abc", "abcdef", "abcd", "abcdefgh", "a"]
    path = _jsonl(tmp_path / "f.jsonl", [_row(t) for t in texts])
    with caplog.at_level(logging.INFO, logger="siirl.data_coordinator.dataloader"):
        ds = PartitionedDataset(path, CharTokenizer(), cfg)
    assert ds.num_filtered == 2 and ds.num_rows_total == 3
    assert [ds[i]["index"] for i in range(len(ds))] == [0, 2, 4]
    assert any("filtered 2 of 5" in r.getMessage() for r in caplog.records)


def test_truncation(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", [_row("ab"), _row("abc"), _row("abcdefg")])
    with pytest.raises(DataError) as err:
        PartitionedDataset(path, CharTokenizer(), DataArguments(max_prompt_length=3))
    assert path in str(err.value) and "row 2" in str(err.value) and "7 tokens" in str(err.value)
    left = PartitionedDataset(path, CharTokenizer(),
                              DataArguments(max_prompt_length=3, truncation="left"))
    assert left[2]["input_ids"].tolist() == [ord(c) for c in "efg"]
    right = PartitionedDataset(path, CharTokenizer(),
                               DataArguments(max_prompt_length=3, truncation="right"))
    assert right[2]["input_ids"].tolist() == [ord(c) for c in "abc"]
    assert right[2]["prompt_text"] == "abcdefg" and right.num_filtered == 0
    with pytest.raises(ConfigError, match="truncation"):
        PartitionedDataset(path, CharTokenizer(), DataArguments(truncation="middle-out"))


def _drop(key):
    def f(r):
        del r[key]
    return f


_BAD = [
    ("data_source", _drop("data_source")),
    ("prompt", _drop("prompt")),
    ("ability", _drop("ability")),
    ("reward_model", _drop("reward_model")),
    ("reward_model.ground_truth", lambda r: r["reward_model"].pop("ground_truth")),
    ("prompt", lambda r: r.update(prompt="just a string")),
    ("prompt", lambda r: r.update(prompt=[])),
    ("prompt", lambda r: r.update(prompt=["hi"])),
    ("content", lambda r: r["prompt"][0].pop("content")),
    ("role", lambda r: r["prompt"][0].update(role=3)),
    ("data_source", lambda r: r.update(data_source=5)),
    ("ability", lambda r: r.update(ability=["math"])),
    ("reward_model", lambda r: r.update(reward_model="42")),
    ("extra_info", lambda r: r.update(extra_info=[1, 2])),
]


@pytest.mark.parametrize("field,mutate", _BAD)
def test_bad_row_names_file_row_field(tmp_path, field, mutate):
    rows = [_row("a"), _row("b"), _row("c")]
    mutate(rows[2])
    path = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError) as err:
        PartitionedDataset(path, CharTokenizer())
    msg = str(err.value)
    assert path in msg and "row 2" in msg and field in msg, msg


def test_bad_parquet_column_and_files(tmp_path):
    table = pa.table({"data_source": ["x"], "ability": ["m"],
                      "prompt": [[{"role": "user", "content": "q"}]]})
    pq.write_table(table, tmp_path / "p.parquet")
    with pytest.raises(DataError, match=r"p\.parquet: row 0: missing required field 'reward"):
        PartitionedDataset(str(tmp_path / "p.parquet"), CharTokenizer())
    with pytest.raises(DataError, match="not found"):
        PartitionedDataset(str(tmp_path / "nope.parquet"), CharTokenizer())
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported"):
        PartitionedDataset(str(tmp_path / "x.csv"), CharTokenizer())
    (tmp_path / "j.jsonl").write_text(json.dumps(_row("a")) + "\n{oops\n")
    with pytest.raises(DataError, match="row 1: not valid JSON"):
        PartitionedDataset(str(tmp_path / "j.jsonl"), CharTokenizer())


def test_custom_prompt_key_and_extra_info_forms(tmp_path):
    rows = [{**_row("q1"), "question": [{"role": "user", "content": "custom"}]},
            {**_row("q2"), "extra_info": None}, {**_row("q3"), "extra_info": '{"a": 1}'}]
    path = _jsonl(tmp_path / "k.jsonl", rows)
    ds = PartitionedDataset(_jsonl(tmp_path / "k1.jsonl", rows[:1]), CharTokenizer(),
                            DataArguments(prompt_key="question"))
    assert ds[0]["prompt_text"] == "custom"
    with pytest.raises(DataError, match="row 1: missing required field 'question'"):
        PartitionedDataset(path, CharTokenizer(), DataArguments(prompt_key="question"))
    ds = PartitionedDataset(path, CharTokenizer())
    assert ds[1]["extra_info"] == {} and ds[2]["extra_info"] == {"a": 1}


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("n", [7, 9, 10])
def test_partitioning_covers_all_once(tmp_path, world_size, n):
    # rows 3 and 5 are overlong and filtered before partitioning
    rows = [_row("x" * (9 if i in (3, 5) else 2)) for i in range(n)]
    path = _jsonl(tmp_path / "p.jsonl", rows)
    cfg = DataArguments(max_prompt_length=5, filter_overlong_prompts=True)
    parts = [PartitionedDataset(path, CharTokenizer(), cfg, rank=r, world_size=world_size)
             for r in range(world_size)]
    seen = [p[i]["index"] for p in parts for i in range(len(p))]
    assert sorted(seen) == [i for i in range(n) if i not in (3, 5)]
    assert len(seen) == len(set(seen))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(p.num_filtered == 2 and p.num_rows_total == n - 2 for p in parts)
    whole = PartitionedDataset(path, CharTokenizer(), cfg)
    assert len(whole) == n - 2


def test_bad_rank():
    with pytest.raises(ConfigError):
        PartitionedDataset("x.parquet", CharTokenizer(), rank=2, world_size=2)
