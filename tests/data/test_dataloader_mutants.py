"""Dataloader behaviour that mutation testing (``nox -s mutmut -- dataloader``) found no test
for: config readers, tokenizer shapes, left truncation to nothing, the order of later
epochs, file-reading edge cases and where a decoding error is reported.

Each test states a behaviour; docs/mutation.md lists the mutants they kill and the ones
that change nothing observable.
"""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from siirl.data_coordinator.dataloader import (
    PartitionedDataset,
    StatefulDataLoader,
    encode_text,
    left_pad,
    read_rows,
)
from siirl.data_coordinator.fields import RAW_PROMPT, SAMPLE_ID
from siirl.data_coordinator.settings import DataArguments
from siirl.errors import ConfigError, DataError


class CharTokenizer:
    pad_token_id = 0

    def __init__(self):
        self.template_kwargs = []

    def encode(self, text, add_special_tokens=True):
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]


class TemplateTokenizer(CharTokenizer):
    chat_template = "{% fake %}"

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, **kw):
        self.template_kwargs.append(kw)
        return "".join(m["content"] for m in messages) + ("!" if kw.get("shout") else "")


def row(content, **extra):
    return {"data_source": "t", "prompt": [{"role": "user", "content": content}],
            "ability": "math", "reward_model": {"ground_truth": "1"}, **extra}


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# ---- config, tokenizers -----------------------------------------------------------------

def test_the_typed_data_section_is_read(tmp_path):
    files = jsonl(tmp_path / "d.jsonl", [row("abcdef")])
    config = DataArguments(max_prompt_length=3, truncation="right")
    data = PartitionedDataset(files, CharTokenizer(), config)
    assert data[0]["input_ids"].tolist() == [ord("a"), ord("b"), ord("c")]


def test_a_mapping_is_refused_naming_the_typed_section(tmp_path):
    """Defaults live on DataArguments' fields only: a dict or DictConfig, whose missing keys
    would need defaults of their own, is refused."""
    files = jsonl(tmp_path / "d.jsonl", [row("x" * 600)])
    for config in ({"max_prompt_length": 600}, OmegaConf.create({"max_prompt_length": 600})):
        with pytest.raises(ConfigError, match=r"DataArguments.*not a (dict|DictConfig)"):
            PartitionedDataset(files, CharTokenizer(), config)


def test_the_default_prompt_limit_is_512_tokens(tmp_path):
    ok = PartitionedDataset(jsonl(tmp_path / "a.jsonl", [row("x" * 512)]), CharTokenizer())
    assert len(ok[0]["input_ids"]) == 512
    with pytest.raises(DataError, match="513 tokens"):
        PartitionedDataset(jsonl(tmp_path / "b.jsonl", [row("x" * 513)]), CharTokenizer())


def test_overlong_prompts_are_not_filtered_unless_asked(tmp_path):
    files = jsonl(tmp_path / "d.jsonl", [row("x" * 5), row("y")])
    with pytest.raises(DataError, match="more than data.max_prompt_length=2"):
        PartitionedDataset(files, CharTokenizer(), DataArguments(max_prompt_length=2))
    kept = PartitionedDataset(files, CharTokenizer(),
                              DataArguments(max_prompt_length=2, filter_overlong_prompts=True))
    assert len(kept) == 1 and kept.num_filtered == 1


def test_chat_template_kwargs_reach_the_template(tmp_path):
    tokenizer = TemplateTokenizer()
    files = jsonl(tmp_path / "d.jsonl", [row("ab")])
    data = PartitionedDataset(files, tokenizer,
                              DataArguments(apply_chat_template_kwargs={"shout": True}))
    assert tokenizer.template_kwargs == [{"shout": True}]
    assert data[0]["prompt_text"] == "ab!"
    plain = PartitionedDataset(files, TemplateTokenizer())
    assert plain[0]["prompt_text"] == "ab"


def test_a_template_method_without_a_template_is_not_used(tmp_path):
    class NoTemplate(TemplateTokenizer):
        chat_template = None

    files = jsonl(tmp_path / "d.jsonl", [{**row("a"), "prompt": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}])
    assert PartitionedDataset(files, NoTemplate())[0]["prompt_text"] == "s\nu"


def test_encode_text_adds_no_special_tokens_whatever_the_tokenizer_shape():
    class OnlyText:
        def encode(self, text):
            return [ord(c) for c in text]

    class Callable:
        def __call__(self, text, add_special_tokens=True):
            ids = ([1] if add_special_tokens else []) + [ord(c) for c in text]
            return {"input_ids": ids}

    class CallableOnlyText:
        def __call__(self, text):
            return {"input_ids": [ord(c) for c in text]}

    class Encoding(dict):  # HF's BatchEncoding: a mapping, with keys()
        pass

    class Mapping:
        def __init__(self, ids):
            self.ids = ids

        def keys(self):
            return ["input_ids"]

        def __getitem__(self, key):
            return self.ids

    class CallableMapping:
        def __call__(self, text, add_special_tokens=True):
            return Mapping(torch.tensor([[ord(c) for c in text]]))

    class CallableList:
        def __call__(self, text, add_special_tokens=True):
            return [ord(c) for c in text]

    class Tensor:
        def encode(self, text, add_special_tokens=True):
            return torch.tensor([[ord(c) for c in text]])

    want = [ord("h"), ord("i")]
    assert encode_text(CharTokenizer(), "hi") == want
    assert encode_text(OnlyText(), "hi") == want
    assert encode_text(Callable(), "hi") == want
    assert encode_text(CallableOnlyText(), "hi") == want
    assert encode_text(CallableMapping(), "hi") == want
    assert encode_text(CallableList(), "hi") == want
    assert encode_text(Tensor(), "hi") == want
    assert Encoding  # (dict subclasses take the dict path, as CallableOnlyText shows)


def test_left_truncation_to_zero_tokens_keeps_nothing(tmp_path):
    files = jsonl(tmp_path / "d.jsonl", [row("abc")])
    data = PartitionedDataset(files, CharTokenizer(),
                              DataArguments(max_prompt_length=0, truncation="left"))
    assert data[0]["input_ids"].tolist() == []
    one = PartitionedDataset(files, CharTokenizer(),
                             DataArguments(max_prompt_length=1, truncation="left"))
    assert one[0]["input_ids"].tolist() == [ord("c")]


# ---- rows ------------------------------------------------------------------------------------

def test_parquet_map_columns_and_json_strings_become_dicts(tmp_path):
    table = pa.table({
        "data_source": ["t", "t"], "ability": ["a", "a"],
        "prompt": [[{"role": "user", "content": "q"}]] * 2,
        "reward_model": pa.array([[("ground_truth", "7")], [("ground_truth", "8")]],
                                 type=pa.map_(pa.string(), pa.string())),
        "extra_info": ['  {"split": "train"}', None],
    })
    pq.write_table(table, tmp_path / "d.parquet")
    data = PartitionedDataset(str(tmp_path / "d.parquet"), CharTokenizer())
    assert [data[i]["ground_truth"] for i in range(2)] == ["7", "8"]
    assert data[0]["extra_info"] == {"split": "train"} and data[1]["extra_info"] == {}


def test_a_list_that_is_not_key_value_pairs_is_not_a_dict(tmp_path):
    files = jsonl(tmp_path / "d.jsonl", [row("q", extra_info=[["a", 1, 2]])])
    with pytest.raises(DataError, match="extra_info"):
        PartitionedDataset(files, CharTokenizer())


def test_a_string_that_is_not_a_json_object_is_not_a_dict(tmp_path):
    for bad in ("{not json", "[1, 2]"):
        files = jsonl(tmp_path / "d.jsonl", [row("q", extra_info=bad)])
        with pytest.raises(DataError, match="'extra_info' must be a dict"):
            PartitionedDataset(files, CharTokenizer())


def test_a_missing_field_message_lists_the_fields_that_have_a_value(tmp_path):
    files = jsonl(tmp_path / "d.jsonl", [{"prompt": None, "zeta": 1, "alpha": 2}])
    with pytest.raises(DataError) as info:
        PartitionedDataset(files, CharTokenizer())
    assert "'alpha', 'zeta'" in str(info.value) and "prompt_key" in str(info.value)
    files = jsonl(tmp_path / "e.jsonl", [{"prompt": None}])
    with pytest.raises(DataError, match=r"fields: none\)"):
        PartitionedDataset(files, CharTokenizer())
    files = jsonl(tmp_path / "f.jsonl", [{**row("q"), "ability": None}])
    with pytest.raises(DataError) as info:
        PartitionedDataset(files, CharTokenizer())
    assert "'ability'" in str(info.value) and "prompt_key" not in str(info.value)


def test_json_array_files_may_start_with_whitespace(tmp_path):
    path = tmp_path / "d.json"
    path.write_text("\n  " + json.dumps([row("a"), row("b")]))
    assert [r["prompt"][0]["content"] for r in read_rows(str(path))] == ["a", "b"]


def test_a_jsonl_file_whose_rows_are_arrays_is_still_read_line_by_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('["a", 1]\n["b", 2]\n')
    assert read_rows(str(path)) == [["a", 1], ["b", 2]]


def test_blank_lines_inside_a_jsonl_file_are_skipped_not_an_end(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(row("a")) + "\n\n   \n" + json.dumps(row("b")) + "\n")
    assert len(read_rows(str(path))) == 2


def test_a_bad_json_line_is_named_by_its_line_number(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(row("a")) + "\n\n{oops\n")
    with pytest.raises(DataError, match=r"line 3\b"):
        read_rows(str(path))


def test_bytes_that_are_not_utf8_are_named_by_row_line_and_byte(tmp_path):
    path = tmp_path / "d.jsonl"
    good = (json.dumps(row("a")) + "\n").encode()
    path.write_bytes(good + b"\n" + good + b'{"x": "\xff"}\n')
    with pytest.raises(DataError) as info:
        read_rows(str(path))
    offset = 2 * len(good) + 1 + len(b'{"x": "')
    assert f"row 2 (line 4, byte {offset})" in str(info.value)


def test_a_byte_order_mark_is_not_part_of_the_first_row(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(row("a")) + "\n").encode())
    assert read_rows(str(path))[0]["data_source"] == "t"


# ---- the loader ----------------------------------------------------------------------------

def items(n):
    return [{"input_ids": torch.tensor([i + 1]), "index": i, RAW_PROMPT: []} for i in range(n)]


def _indices(batch):
    from siirl.data_coordinator import get_non_tensor

    return list(get_non_tensor(batch, "index"))


def test_epoch_e_uses_the_permutation_of_seed_plus_e(tmp_path):
    data = items(12)
    loader = StatefulDataLoader(data, batch_size=4, pad_token_id=0, seed=5)
    epochs = [[i for b in loader for i in _indices(b)] for _ in range(3)]
    for e in range(3):
        want = torch.randperm(12, generator=torch.Generator().manual_seed(5 + e)).tolist()
        assert epochs[e] == want
    assert loader.epoch == 3


def test_sample_ids_are_unique_over_epochs_and_counted_from_the_epoch():
    data = items(4)
    loader = StatefulDataLoader(data, batch_size=2, pad_token_id=0, shuffle=False)
    ids = [b.get(SAMPLE_ID).tolist() for _ in range(3) for b in loader]
    assert ids == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]


def test_a_rank_equal_to_the_number_of_ranks_is_refused():
    with pytest.raises(DataError, match="outside"):
        StatefulDataLoader(items(8), batch_size=2, pad_token_id=0, rank=2, num_ranks=2)
    StatefulDataLoader(items(8), batch_size=2, pad_token_id=0, rank=1, num_ranks=2)


def test_left_pad_of_no_sequences_and_of_int32_ids():
    ids, mask, pos = left_pad([], pad_token_id=0)
    assert ids.shape == mask.shape == pos.shape == (0, 0)
    ids, _, _ = left_pad([torch.tensor([3, 4], dtype=torch.int32)], pad_token_id=9)
    assert ids.dtype == torch.long and ids.tolist() == [[3, 4]]
    ids, _, _ = left_pad([torch.tensor([], dtype=torch.long)], pad_token_id=9)
    assert ids.shape == (1, 0)


def test_too_few_rows_names_the_dataset_and_the_global_batch(tmp_path):
    files = jsonl(tmp_path / "d.jsonl", [row("a"), row("b"), row("c")])
    data = PartitionedDataset(files, CharTokenizer())
    with pytest.raises(DataError) as info:
        StatefulDataLoader(data, batch_size=2, pad_token_id=0, num_ranks=2)
    text = str(info.value)
    assert "d.jsonl: 3 rows" in text and "keeps 3 rows" in text
    assert "batch_size=2 x 2 ranks = 4" in text and "train_batch_size=4" in text
    with pytest.raises(DataError) as info:
        StatefulDataLoader(data, batch_size=4, pad_token_id=0)
    assert "batch_size=4 (data.train_batch_size=4)" in str(info.value)
    with pytest.raises(DataError, match=r"^the dataset has no rows"):
        StatefulDataLoader([], batch_size=4, pad_token_id=0, drop_last=False)


def test_an_epoch_ended_without_stop_iteration_moves_on_at_the_next_iter():
    from itertools import islice

    loader = StatefulDataLoader(items(4), batch_size=2, pad_token_id=0, shuffle=False)
    seen = []
    for _ in range(3):  # take exactly one epoch's batches, never hitting StopIteration
        seen.append([b.get(SAMPLE_ID).tolist() for b in islice(iter(loader), len(loader))])
    assert seen == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]]]
    assert loader.state_dict()["epoch"] == 2 and loader.batches_done == 2


def test_a_decoding_error_names_the_file_and_counts_lines_from_the_start(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n" + b'{"x": "\xff"}\n')  # a blank first line, then the bad row
    with pytest.raises(DataError) as info:
        read_rows(str(path))
    assert str(info.value).startswith(f"{path}: row 0 (line 2, byte 8)")


def test_a_folder_or_a_missing_file_is_named_as_such(tmp_path):
    with pytest.raises(DataError, match="a folder, not a file"):
        read_rows(str(tmp_path))
    with pytest.raises(DataError, match="not found: no such file"):
        read_rows(str(tmp_path / "missing.jsonl"))


def test_an_empty_dataset_says_whether_files_were_empty_or_filtered(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n\n")
    other = tmp_path / "o.jsonl"
    other.write_text("")
    with pytest.raises(DataError) as info:
        PartitionedDataset([str(empty), str(other)], CharTokenizer())
    text = str(info.value)
    assert f"({empty}: 0 rows; {other}: 0 rows)" in text and "empty or holds" in text
    files = jsonl(tmp_path / "d.jsonl", [row("abc"), row("def")])
    with pytest.raises(DataError) as info:
        PartitionedDataset(files, CharTokenizer(),
                           DataArguments(max_prompt_length=1, filter_overlong_prompts=True))
    text = str(info.value)
    assert f"({files}: 2 rows, 2 filtered)" in text and "removed all 2 rows" in text


def test_too_few_rows_counts_the_rows_of_every_rank(tmp_path):
    files = jsonl(tmp_path / "d.jsonl", [row("a"), row("b"), row("c")])
    share = PartitionedDataset(files, CharTokenizer(), rank=0, world_size=2)
    assert len(share) == 2
    with pytest.raises(DataError, match="keeps 3 rows"):
        StatefulDataLoader(share, batch_size=4, pad_token_id=0)


def test_a_reward_model_that_is_no_dict_is_named(tmp_path):
    files = jsonl(tmp_path / "d.jsonl", [row("q", reward_model="7")])
    with pytest.raises(DataError, match=r"row 0: field 'reward_model' must be a dict"):
        PartitionedDataset(files, CharTokenizer())


def test_the_no_special_tokens_flag_is_a_real_bool():
    """HF's fast tokenizers hand the flag to Rust, which takes a bool only."""

    class Strict:
        def encode(self, text, add_special_tokens=True):
            if not isinstance(add_special_tokens, bool):
                raise TypeError("add_special_tokens must be a bool")
            return ([1] if add_special_tokens else []) + [ord(c) for c in text]

    class StrictCallable:
        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": Strict().encode(text, add_special_tokens)}

    assert encode_text(Strict(), "a") == [ord("a")]
    assert encode_text(StrictCallable(), "a") == [ord("a")]
