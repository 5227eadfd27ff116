"""Tests for the batch protocol (siirl.data_coordinator.protocol)."""

import pickle
import warnings

import pytest
import torch
from tensordict import TensorDict

from siirl.data_coordinator import (
    batch_num_tokens,
    chunk,
    concat,
    get_non_tensor,
    group_indices,
    make_batch,
    merge,
    non_tensor_keys,
    repeat_interleave,
    select_rows,
    set_non_tensor,
    split,
    tensor_keys,
)
from siirl.errors import DataError, SiirlError


def _batch(b=4, offset=0):
    ids = torch.arange(offset, offset + b).unsqueeze(1).repeat(1, 3)  # row i holds i
    mask = torch.ones(b, 3, dtype=torch.long)
    mask[:, 2] = 0
    return make_batch(
        tensors={"input_ids": ids, "attention_mask": mask},
        non_tensors={
            "prompt": [f"p{i}" for i in range(offset, offset + b)],
            "extra_info": [{"index": i, "tags": [i, i + 1]} for i in range(offset, offset + b)],
        },
    )


def _assert_aligned(batch):
    """Every row's prompt and extra_info must match its input_ids value."""
    row_ids = batch["input_ids"][:, 0].tolist()
    assert get_non_tensor(batch, "prompt") == [f"p{i}" for i in row_ids]
    assert [e["index"] for e in get_non_tensor(batch, "extra_info")] == row_ids


# make_batch / get / set / keys


def test_make_batch_fields_and_keys():
    batch = _batch()
    assert isinstance(batch, TensorDict)
    assert batch.batch_size == torch.Size([4])
    assert tensor_keys(batch) == ["input_ids", "attention_mask"]
    assert non_tensor_keys(batch) == ["prompt", "extra_info"]
    _assert_aligned(batch)


def test_make_batch_dict_values_survive():
    batch = _batch()
    extra = get_non_tensor(batch, "extra_info")
    assert extra[2] == {"index": 2, "tags": [2, 3]}
    assert isinstance(extra, list) and len(extra) == 4


def test_make_batch_list_valued_rows_keep_batch_shape():
    # Equal-length list rows must stay one value per row, not become a 2-D field.
    batch = make_batch(non_tensors={"tags": [[1, 2], [3, 4]]})
    assert batch.batch_size == torch.Size([2])
    assert batch.get("tags").batch_size == torch.Size([2])
    other = make_batch(non_tensors={"tags": [[5]]})
    assert get_non_tensor(concat([batch, other]), "tags") == [[1, 2], [3, 4], [5]]


def test_make_batch_tensor_length_mismatch():
    with pytest.raises(DataError, match=r"'mask'.*3.*4"):
        make_batch(tensors={"ids": torch.zeros(4, 2), "mask": torch.zeros(3, 2)})


def test_make_batch_list_length_mismatch():
    with pytest.raises(DataError, match=r"'prompt'.*2.*4"):
        make_batch(tensors={"ids": torch.zeros(4, 2)}, non_tensors={"prompt": ["a", "b"]})


def test_make_batch_explicit_size_and_errors():
    assert make_batch(batch_size=3).batch_size == torch.Size([3])
    assert make_batch(non_tensors={"x": ["a"]}).batch_size == torch.Size([1])
    with pytest.raises(DataError, match="batch_size"):
        make_batch()
    with pytest.raises(DataError, match="'ids'"):
        make_batch(tensors={"ids": torch.zeros(2)}, batch_size=3)
    assert issubclass(DataError, SiirlError)


def test_set_non_tensor_replaces_and_checks_length():
    batch = _batch()
    set_non_tensor(batch, "prompt", ["a", "b", "c", "d"])
    assert get_non_tensor(batch, "prompt") == ["a", "b", "c", "d"]
    set_non_tensor(batch, "answer", [None, 1, 2.5, "x"])
    assert get_non_tensor(batch, "answer") == [None, 1, 2.5, "x"]
    assert non_tensor_keys(batch) == ["prompt", "extra_info", "answer"]
    with pytest.raises(DataError, match=r"'prompt'.*3.*4"):
        set_non_tensor(batch, "prompt", ["a", "b", "c"])
    with pytest.raises(DataError):
        set_non_tensor(batch, "prompt", "abcd")  # a string is not a list of rows


def test_get_non_tensor_errors():
    batch = _batch()
    with pytest.raises(DataError, match="'missing'"):
        get_non_tensor(batch, "missing")
    with pytest.raises(DataError, match="tensor field"):
        get_non_tensor(batch, "input_ids")


def test_get_non_tensor_broadcast_value():
    # TensorDict.set_non_tensor stores one value for all rows; still read as B items.
    batch = _batch()
    batch.set_non_tensor("split", "train")
    assert get_non_tensor(batch, "split") == ["train"] * 4


# repeat_interleave / group_indices


def test_repeat_interleave_assigns_group_uids():
    batch = _batch(3)
    out = repeat_interleave(batch, 4)
    assert out.batch_size == torch.Size([12])
    assert "uid" not in batch  # input untouched
    uids = get_non_tensor(out, "uid")
    groups = [uids[i * 4 : (i + 1) * 4] for i in range(3)]
    assert all(len(set(g)) == 1 for g in groups)
    assert len({g[0] for g in groups}) == 3
    assert out["input_ids"][:, 0].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    _assert_aligned(out)


def test_repeat_interleave_keeps_existing_uids():
    batch = _batch(2)
    set_non_tensor(batch, "uid", ["a", "b"])
    out = repeat_interleave(batch, 2)
    assert get_non_tensor(out, "uid") == ["a", "a", "b", "b"]
    out = repeat_interleave(batch, 3, uid_key="group")
    assert get_non_tensor(out, "uid") == ["a"] * 3 + ["b"] * 3
    assert len(set(get_non_tensor(out, "group"))) == 2
    with pytest.raises(DataError):
        repeat_interleave(batch, 0)


def test_group_indices():
    batch = make_batch(non_tensors={"uid": ["b", "a", "b", "c", "a"]})
    assert group_indices(batch) == {"b": [0, 2], "a": [1, 4], "c": [3]}
    assert list(group_indices(batch)) == ["b", "a", "c"]
    out = repeat_interleave(_batch(3), 2)
    assert list(group_indices(out).values()) == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(DataError, match="'uid'"):
        group_indices(_batch())


# concat / split / chunk / select_rows


def test_concat_aligned():
    out = concat([_batch(2), _batch(3, offset=2)])
    assert out.batch_size == torch.Size([5])
    assert out["input_ids"][:, 0].tolist() == [0, 1, 2, 3, 4]
    _assert_aligned(out)


def test_concat_key_mismatch_names_key():
    a, b = _batch(2), _batch(2)
    set_non_tensor(b, "answer", ["x", "y"])
    with pytest.raises(DataError, match=r"batch 0 lacks \['answer'\]"):
        concat([a, b])
    with pytest.raises(DataError):
        concat([])


def test_split_aligned_and_last_smaller():
    parts = split(_batch(5), 2)
    assert [p.batch_size[0] for p in parts] == [2, 2, 1]
    for p in parts:
        _assert_aligned(p)
    assert get_non_tensor(parts[2], "prompt") == ["p4"]
    assert get_non_tensor(concat(parts), "prompt") == [f"p{i}" for i in range(5)]
    with pytest.raises(DataError):
        split(_batch(2), 0)


def test_chunk_equal_parts_and_divisibility():
    parts = chunk(_batch(6), 3)
    assert [p.batch_size[0] for p in parts] == [2, 2, 2]
    assert get_non_tensor(parts[1], "prompt") == ["p2", "p3"]
    for p in parts:
        _assert_aligned(p)
    with pytest.raises(DataError, match=r"5 rows into 2"):
        chunk(_batch(5), 2)


@pytest.mark.parametrize(
    "index",
    [[3, 0, 2], torch.tensor([3, 0, 2]), torch.tensor([True, False, True, True])],
)
def test_select_rows_aligned(index):
    out = select_rows(_batch(4), index)
    _assert_aligned(out)
    is_mask = isinstance(index, torch.Tensor) and index.dtype == torch.bool
    expected = [0, 2, 3] if is_mask else [3, 0, 2]
    assert out["input_ids"][:, 0].tolist() == expected


def test_select_rows_repeated_and_empty():
    out = select_rows(_batch(3), [1, 1])
    assert get_non_tensor(out, "prompt") == ["p1", "p1"]
    assert select_rows(_batch(3), []).batch_size == torch.Size([0])


# merge


def test_merge_unions_fields_later_wins():
    a = _batch(3)
    b = make_batch(
        tensors={"input_ids": torch.full((3, 3), 9), "scores": torch.tensor([1.0, 2.0, 3.0])},
        non_tensors={"prompt": ["x", "y", "z"], "answer": ["1", "2", "3"]},
    )
    out = merge([a, b])
    assert set(out.keys()) == {
        "input_ids",
        "attention_mask",
        "prompt",
        "extra_info",
        "scores",
        "answer",
    }
    assert torch.equal(out["input_ids"], torch.full((3, 3), 9))
    assert get_non_tensor(out, "prompt") == ["x", "y", "z"]
    assert get_non_tensor(out, "extra_info")[1]["index"] == 1
    assert get_non_tensor(merge([b, a]), "prompt") == ["p0", "p1", "p2"]
    # inputs untouched
    assert set(a.keys()) == {"input_ids", "attention_mask", "prompt", "extra_info"}
    assert get_non_tensor(a, "prompt") == ["p0", "p1", "p2"]
    assert a["input_ids"][:, 0].tolist() == [0, 1, 2]
    # merged rows stay aligned when sliced afterwards
    assert get_non_tensor(select_rows(out, [2]), "answer") == ["3"]
    # writing to the merged batch does not reach its inputs
    set_non_tensor(out, "answer", ["a", "b", "c"])
    out.set("scores", torch.zeros(3))
    assert get_non_tensor(b, "answer") == ["1", "2", "3"]
    assert b["scores"].tolist() == [1.0, 2.0, 3.0]


def test_merge_tensor_and_non_tensor_same_name():
    a = make_batch(tensors={"f": torch.zeros(2)})
    b = make_batch(non_tensors={"f": ["u", "v"]})
    assert get_non_tensor(merge([a, b]), "f") == ["u", "v"]
    assert torch.equal(merge([b, a])["f"], torch.zeros(2))


def test_merge_batch_size_error():
    with pytest.raises(DataError, match=r"3.*2"):
        merge([_batch(3), _batch(2)])
    with pytest.raises(DataError):
        merge([])


# batch_num_tokens / pickling


def test_batch_num_tokens():
    batch = _batch(3)
    batch.get("attention_mask")[1] = 0
    assert batch_num_tokens(batch).tolist() == [2, 0, 2]
    assert batch_num_tokens(batch).dtype == torch.long
    with pytest.raises(DataError):
        batch_num_tokens(batch, mask_key="nope")


def test_pickle_round_trip():
    batch = repeat_interleave(_batch(3), 2)
    loaded = pickle.loads(pickle.dumps(batch))
    assert loaded.batch_size == batch.batch_size
    assert tensor_keys(loaded) == tensor_keys(batch)
    assert non_tensor_keys(loaded) == non_tensor_keys(batch)
    for key in non_tensor_keys(batch):
        assert get_non_tensor(loaded, key) == get_non_tensor(batch, key)
    assert torch.equal(loaded["input_ids"], batch["input_ids"])
    assert get_non_tensor(loaded, "extra_info")[3] == {"index": 1, "tags": [1, 2]}
    # a loaded batch still behaves like a batch
    _assert_aligned(concat(split(loaded, 4)))


def test_operations_emit_no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = repeat_interleave(_batch(4), 2)
        out = concat(split(select_rows(batch, [7, 0, 3]), 2) + chunk(batch, 2))
        out = merge([out, make_batch(non_tensors={"a": list(range(11))})])
        pickle.loads(pickle.dumps(out))
        group_indices(out)
