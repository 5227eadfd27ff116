"""Tests for the left-padding collate and the resumable StatefulDataLoader."""

import pytest
import torch
from tensordict import TensorDict

from siirl.data_coordinator import get_non_tensor, non_tensor_keys
from siirl.data_coordinator.dataloader import (
    PartitionedDataset,
    StatefulDataLoader,
    collate_left_pad,
    left_pad,
)
from siirl.data_coordinator.tasks.arithmetic import make_rows, write_parquet
from siirl.errors import DataError

PAD = 0


def _items(n):
    # row i: i % 4 + 1 tokens, all equal to 10 + i, so a row's origin is visible in its ids
    return [{"input_ids": torch.full((i % 4 + 1,), 10 + i, dtype=torch.long),
             "index": i, "extra_info": {"i": i}, "raw_prompt": [{"role": "user", "content": "q"}]}
            for i in range(n)]


def _indices(batch):
    return get_non_tensor(batch, "index")


def test_left_pad_mask_positions():
    seqs = [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([9, 4])]
    ids, mask, pos = left_pad(seqs, pad_token_id=PAD)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 9, 4]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 1]]
    assert ids.dtype == mask.dtype == pos.dtype == torch.long


def test_collate_fields():
    batch = collate_left_pad(_items(3), pad_token_id=-1)
    assert isinstance(batch, TensorDict) and batch.batch_size == torch.Size([3])
    assert batch["input_ids"].tolist() == [[-1, -1, 10], [-1, 11, 11], [12, 12, 12]]
    assert batch["attention_mask"].sum(1).tolist() == [1, 2, 3]
    assert batch["position_ids"][2].tolist() == [0, 1, 2]
    assert set(non_tensor_keys(batch)) == {"index", "extra_info", "raw_prompt"}
    assert get_non_tensor(batch, "extra_info") == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert get_non_tensor(batch, "raw_prompt")[0] == [{"role": "user", "content": "q"}]


def test_len_and_drop_last():
    data = _items(10)
    assert len(StatefulDataLoader(data, 4, PAD)) == 2
    loader = StatefulDataLoader(data, 4, PAD, shuffle=False, drop_last=False)
    assert len(loader) == 3
    batches = list(loader)
    assert [b.batch_size[0] for b in batches] == [4, 4, 2]
    assert sum((_indices(b) for b in batches), []) == list(range(10))
    with pytest.raises(DataError, match="fewer than batch_size"):
        StatefulDataLoader(_items(3), 4, PAD)
    with pytest.raises(DataError):
        StatefulDataLoader([], 4, PAD, drop_last=False)


def test_rows_match_their_ids():
    for batch in StatefulDataLoader(_items(12), 3, PAD, seed=5):
        for row, idx in enumerate(_indices(batch)):
            mask = batch["attention_mask"][row].bool()
            assert (batch["input_ids"][row][mask] == 10 + idx).all()
            assert int(mask.sum()) == idx % 4 + 1


def _epoch_order(loader):
    return sum((_indices(b) for b in loader), [])


def test_shuffle_reproducible_and_epochs_differ():
    data = _items(20)
    a, b = StatefulDataLoader(data, 5, PAD, seed=3), StatefulDataLoader(data, 5, PAD, seed=3)
    a_epochs = [_epoch_order(a) for _ in range(3)]
    assert a_epochs == [_epoch_order(b) for _ in range(3)]
    assert a.epoch == 3 and a.state_dict() == {"epoch": 3, "batches_done": 0, "seed": 3}
    assert all(sorted(o) == list(range(20)) for o in a_epochs)
    assert a_epochs[0] != a_epochs[1] != a_epochs[2]
    assert a_epochs[0] != list(range(20))
    other = StatefulDataLoader(data, 5, PAD, seed=4)
    assert _epoch_order(other) != a_epochs[0]
    plain = StatefulDataLoader(data, 5, PAD, shuffle=False)
    assert _epoch_order(plain) == list(range(20)) == _epoch_order(plain)


def _same(x, y):
    assert set(x.keys()) == set(y.keys())
    for key in x.keys():
        vx, vy = x.get(key), y.get(key)
        if isinstance(vx, torch.Tensor):
            assert vx.dtype == vy.dtype and torch.equal(vx, vy), key
        else:
            assert get_non_tensor(x, key) == get_non_tensor(y, key), key


def _take(loader, k):
    """The next k batches, crossing epochs the way a trainer loop does."""
    out = []
    while len(out) < k:
        for batch in loader:
            out.append(batch)
            if len(out) == k:
                break
    return out


@pytest.mark.parametrize("k", [0, 1, 3, 4, 5, 9])
def test_resume_bitwise(tmp_path, k):
    write_parquet(make_rows(26, seed=2), tmp_path / "a.parquet")

    class Tok:
        pad_token_id = 0

        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    ds = PartitionedDataset(str(tmp_path / "a.parquet"), Tok())
    make = lambda: StatefulDataLoader(ds, 6, Tok.pad_token_id, seed=11)  # noqa: E731
    reference = _take(make(), 12)  # 4 batches per epoch: 3 epochs

    first = make()
    _take(first, k)
    state = first.state_dict()
    assert state["seed"] == 11 and state["epoch"] * 4 + state["batches_done"] == k
    resumed = StatefulDataLoader(ds, 6, 0, seed=999)  # the seed comes from the state
    resumed.load_state_dict(state)
    rest = _take(resumed, 12 - k)
    assert len(rest) == 12 - k
    for want, got in zip(reference[k:], rest, strict=True):
        _same(want, got)


def test_state_at_epoch_end_rolls_over():
    loader = StatefulDataLoader(_items(8), 4, PAD, seed=0)
    it = iter(loader)
    next(it), next(it)  # the whole epoch 0, without reaching StopIteration
    state = loader.state_dict()
    assert state == {"epoch": 0, "batches_done": 2, "seed": 0}
    fresh = StatefulDataLoader(_items(8), 4, PAD, seed=0)
    fresh.load_state_dict(state)
    ref = StatefulDataLoader(_items(8), 4, PAD, seed=0)
    _epoch_order(ref)  # epoch 0, run to the end
    epoch1 = _epoch_order(ref)
    assert _epoch_order(fresh) == epoch1
    assert fresh.epoch == ref.epoch == 2
    assert _epoch_order(loader) == epoch1  # a new iter() on the same loader rolls over too
    assert list(it) == [] and loader.epoch == 2  # the stale iterator moves nothing


def test_stale_iterator_does_not_move_position():
    loader = StatefulDataLoader(_items(12), 4, PAD, seed=0)
    old = iter(loader)
    next(old)
    new = iter(loader)  # continues from batch 1 of epoch 0
    assert loader.state_dict()["batches_done"] == 1
    next(new)
    assert list(old) == [] and loader.state_dict() == {"epoch": 0, "batches_done": 2, "seed": 0}


def test_bad_state():
    loader = StatefulDataLoader(_items(8), 4, PAD)
    with pytest.raises(DataError, match="lacks"):
        loader.load_state_dict({"epoch": 0})
    with pytest.raises(DataError, match="does not fit"):
        loader.load_state_dict({"epoch": 0, "batches_done": 3, "seed": 1})


@pytest.mark.parametrize("n,world_size,bs", [(10, 3, 2), (11, 2, 3), (9, 3, 3), (7, 2, 1)])
def test_uneven_shares_same_batch_count(tmp_path, n, world_size, bs):
    rows = make_rows(n, seed=0)
    write_parquet(rows, tmp_path / "a.parquet")

    class Tok:
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    loaders = [StatefulDataLoader(PartitionedDataset(str(tmp_path / "a.parquet"), Tok(),
                                                     rank=r, world_size=world_size), bs, PAD)
               for r in range(world_size)]
    counts = {len(ld) for ld in loaders}
    assert counts == {n // world_size // bs}
    assert {len(list(ld)) for ld in loaders} == counts


def test_ranks_take_slices_of_the_same_global_batch():
    """Two ranks together load exactly the 1-rank batches, each its half, in every epoch;
    sample ids are the same whichever rank holds a row."""
    ds = _items(40)
    whole = StatefulDataLoader(ds, batch_size=8, pad_token_id=0, seed=3)
    halves = [StatefulDataLoader(ds, batch_size=4, pad_token_id=0, seed=3, rank=r,
                                 num_ranks=2) for r in (0, 1)]
    assert len(whole) == len(halves[0]) == len(halves[1]) == 5
    for _ in range(2):  # two epochs
        for big, a, b in zip(whole, *halves, strict=True):
            assert _indices(big) == _indices(a) + _indices(b)
            assert big["sample_id"].tolist() == a["sample_id"].tolist() + b["sample_id"].tolist()
    ids = [i for batch in whole for i in batch["sample_id"].tolist()]
    assert ids == list(range(80, 120))  # epoch 2 of 40 rows: unique over the run


def test_shared_loader_needs_drop_last():
    with pytest.raises(DataError, match="drop_last"):
        StatefulDataLoader(_items(8), batch_size=2, pad_token_id=0, drop_last=False, rank=0,
                           num_ranks=2)


@pytest.mark.parametrize("mini_batches,num_ranks", [(2, 2), (4, 2), (2, 4), (3, 2), (6, 4)])
def test_each_rank_takes_its_share_of_every_mini_batch(mini_batches, num_ranks):
    """With m mini-batches a rank's k-th contiguous run of batch_size / m rows is its part of
    the 1-rank loader's k-th mini-batch; the ranks' k-th runs together are exactly it."""
    ds, batch = _items(72), 24
    whole = StatefulDataLoader(ds, batch_size=batch, pad_token_id=0, seed=5)
    ranks = [StatefulDataLoader(ds, batch_size=batch // num_ranks, pad_token_id=0, seed=5,
                                rank=r, num_ranks=num_ranks, mini_batches=mini_batches)
             for r in range(num_ranks)]
    mini, share = batch // mini_batches, batch // mini_batches // num_ranks
    for _ in range(2):  # two epochs
        for big, *parts in zip(whole, *ranks, strict=True):
            ids = big["sample_id"].tolist()
            for k in range(mini_batches):
                union = [i for part in parts
                         for i in part["sample_id"].tolist()[k * share:(k + 1) * share]]
                assert union == ids[k * mini:(k + 1) * mini]
            assert sorted(sum((_indices(p) for p in parts), [])) == sorted(_indices(big))


def test_one_rank_with_mini_batches_loads_the_plain_order():
    plain = StatefulDataLoader(_items(24), batch_size=8, pad_token_id=0, seed=2)
    chunked = StatefulDataLoader(_items(24), batch_size=8, pad_token_id=0, seed=2,
                                 mini_batches=4)
    assert _epoch_order(plain) == _epoch_order(chunked)


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_resume_with_mini_batches(k):
    """A restored rank of a chunked loader continues with the batches an uninterrupted one
    would have yielded (the state is the same {epoch, batches_done, seed})."""
    make = lambda: StatefulDataLoader(_items(40), batch_size=4, pad_token_id=0, seed=9,  # noqa: E731
                                      rank=1, num_ranks=2, mini_batches=2)
    reference = _take(make(), 8)
    first = make()
    _take(first, k)
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    for want, got in zip(reference[k:], _take(resumed, 8 - k), strict=True):
        _same(want, got)


def test_mini_batches_must_split_into_whole_rank_shares():
    with pytest.raises(DataError, match="3 mini-batches"):
        StatefulDataLoader(_items(40), batch_size=4, pad_token_id=0, rank=0, num_ranks=2,
                           mini_batches=3)
