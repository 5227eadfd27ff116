"""Epoch-based, resumable loader turning dataset items into left-padded TensorDict batches.

The order of epoch ``e`` is a pure function of ``(seed + e, len(dataset))``, so the loader's
whole state is ``{"epoch", "batches_done", "seed"}``: a loader restored from a state taken
after ``k`` batches rebuilds the same permutation and skips the first ``k`` batches,
yielding exactly what an uninterrupted loader would have yielded next.

With ``num_ranks`` workers, every worker builds the same epoch permutation of the whole
dataset and takes its slice of each global batch. The global batch, and so training, is
then the same whatever the number of workers; each worker collates only its own rows.
With ``mini_batches`` m the global batch is cut into m equal consecutive chunks (the PPO
mini-batches one worker would train on in turn) and a rank takes its ``rank``-th run of
``batch_size / m`` rows out of each chunk: a worker that cuts its rows into m contiguous
mini-batches then holds its share of the one-worker run's k-th mini-batch as its k-th, so
N workers take the same optimizer steps on the same rows as one. m = 1 is the plain
``rank``-th run of ``batch_size`` rows out of ``batch_size * num_ranks``. Each row carries
``sample_id`` (epoch * len(dataset) + position in the epoch's order): a key unique over the
run and independent of the split, from which rollout noise and group ids are derived.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from tensordict import TensorDict

from siirl.data_coordinator.fields import ATTENTION_MASK, INPUT_IDS, POSITION_IDS, SAMPLE_ID
from siirl.data_coordinator.protocol import make_batch
from siirl.errors import DataError

__all__ = ["StatefulDataLoader", "collate_left_pad", "left_pad"]


def left_pad(seqs: Sequence[torch.Tensor], pad_token_id: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``input_ids``, ``attention_mask``, ``position_ids`` ``[B, P]`` for 1-D id tensors.

    Left padding to the longest sequence keeps every prompt's last token in the last
    column, where generation continues. ``position_ids`` = cumsum(mask) - 1, clipped at
    0, so real tokens are numbered from 0 and pads sit at 0.
    """
    longest = max((int(s.numel()) for s in seqs), default=0)
    ids = torch.full((len(seqs), longest), int(pad_token_id), dtype=torch.long)
    mask = torch.zeros((len(seqs), longest), dtype=torch.long)
    for row, seq in enumerate(seqs):
        n = int(seq.numel())
        if n:
            ids[row, longest - n:] = seq.reshape(-1).to(torch.long)
            mask[row, longest - n:] = 1
    position_ids = (torch.cumsum(mask, dim=1) - 1).clamp(min=0)
    return ids, mask, position_ids


def collate_left_pad(items: Sequence[dict], pad_token_id: int) -> TensorDict:
    """One batch from dataset items: padded tensors plus every other key as non-tensor."""
    if not items:
        raise DataError("cannot collate an empty list of items")
    ids, mask, pos = left_pad([torch.as_tensor(it[INPUT_IDS]) for it in items], pad_token_id)
    keys = [k for k in items[0] if k != INPUT_IDS]
    for i, it in enumerate(items):
        if set(it) != set(items[0]):
            raise DataError(f"item {i} has fields {sorted(it)}, item 0 has {sorted(items[0])}")
    return make_batch(
        tensors={INPUT_IDS: ids, ATTENTION_MASK: mask, POSITION_IDS: pos},
        non_tensors={k: [it[k] for it in items] for k in keys},
    )


class StatefulDataLoader:
    """Iterates epochs of batches; each ``iter()`` runs the rest of the current epoch.

    After an epoch's last batch the loader moves to the next epoch, which (when
    ``shuffle``) uses the permutation from ``torch.Generator().manual_seed(seed + epoch)``.
    With ``drop_last`` the rows past the last full batch of that permutation are skipped
    for the epoch (and, for a dataset with ``min_rank_rows``, the batch count is taken
    from that, so ranks with uneven shares stay in step).
    With ``num_ranks > 1`` a batch is this rank's slice of the global batch (its share of
    each of the ``mini_batches`` chunks: see the module docstring) and ``len()`` counts
    global batches.
    Iterators share the loader's position, so only the newest ``iter()`` is live: an
    older one stops at its next step.
    """

    def __init__(self, dataset: Any, batch_size: int, pad_token_id: int, shuffle: bool = True,
                 seed: int = 1, drop_last: bool = True, rank: int = 0, num_ranks: int = 1,
                 mini_batches: int = 1):
        if batch_size < 1:
            raise DataError(f"batch_size must be >= 1, got {batch_size}")
        if mini_batches < 1 or batch_size % mini_batches:
            # each rank takes an equal whole number of rows out of every chunk
            raise DataError(
                f"a global batch of {batch_size * num_ranks} rows cannot be cut into "
                f"{mini_batches} mini-batches with an equal whole share for each of "
                f"{num_ranks} ranks ({batch_size} rows per rank): data.train_batch_size must "
                "be a multiple of the number of mini-batches times the data-loading workers")
        if not 0 <= rank < num_ranks:
            raise DataError(f"rank {rank} is outside 0..{num_ranks - 1}")
        if num_ranks > 1 and not drop_last:
            # a short last global batch would leave some ranks with nothing to run
            raise DataError("a loader shared by several ranks needs drop_last=True")
        self.rank, self.num_ranks = int(rank), int(num_ranks)
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.pad_token_id = int(pad_token_id)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.mini_batches = int(mini_batches)
        self._epoch = 0
        self._batches_done = 0
        self._active: object | None = None
        if len(self) == 0:
            raise DataError(self._too_small())

    def _too_small(self) -> str:
        # a PartitionedDataset names its files, their row counts and what was filtered
        describe = getattr(self.dataset, "describe", None)
        what = f"the dataset ({describe()})" if callable(describe) else "the dataset"
        rows = int(getattr(self.dataset, "num_rows_total", len(self.dataset)))
        if self.num_ranks == 1 and not self.drop_last:
            return f"{what} has no rows: no batch to load"
        batch = self.batch_size * self.num_ranks
        ranks = f" x {self.num_ranks} ranks = {batch}" if self.num_ranks > 1 else ""
        return (f"too few rows for one batch: {what} keeps {rows} rows, fewer than "
                f"batch_size={self.batch_size}{ranks} (data.train_batch_size={batch}); add "
                "rows or lower data.train_batch_size")

    def __len__(self) -> int:
        n = len(self.dataset)
        if self.drop_last:
            # a PartitionedDataset shard may hold one row more than another rank's; count
            # batches from the smallest share so all ranks run the same number of steps
            n = min(n, int(getattr(self.dataset, "min_rank_rows", n)))
            return n // (self.batch_size * self.num_ranks)
        return -(-n // self.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch being (or next to be) iterated, 0-based."""
        return self._epoch

    @property
    def batches_done(self) -> int:
        """Batches of the current epoch already yielded."""
        return self._batches_done

    def _order(self, epoch: int) -> list[int]:
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        gen = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(n, generator=gen).tolist()

    def __iter__(self) -> Iterator[TensorDict]:
        if self._batches_done >= len(self):  # the previous epoch ended without StopIteration
            self._epoch += 1
            self._batches_done = 0
        token = self._active = object()  # a newer iter() or load_state_dict() retires this one
        order = self._order(self._epoch)
        base = self._epoch * len(self.dataset)
        while self._batches_done < len(self):
            positions = self._positions(self._batches_done, len(order))
            batch = collate_left_pad([self.dataset[order[p]] for p in positions],
                                     self.pad_token_id)
            batch.set(SAMPLE_ID, torch.tensor([base + p for p in positions], dtype=torch.long))
            # counted before the yield, so a state taken while the consumer holds this
            # batch already says it was delivered
            self._batches_done += 1
            yield batch
            if self._active is not token:
                return  # stale iterator: must not move the loader's position
        self._epoch += 1
        self._batches_done = 0

    def batch_of(self, sample_ids: Sequence[int]) -> TensorDict:
        """The rows of ``sample_ids`` (ids this loader gave out: ``epoch * len(dataset) +
        position``), as one batch, e.g. to generate a prompt again."""
        rows = len(self.dataset)
        orders: dict[int, list[int]] = {}
        items = []
        for sample_id in sample_ids:
            epoch, position = divmod(int(sample_id), rows)
            if epoch not in orders:
                orders[epoch] = self._order(epoch)
            items.append(self.dataset[orders[epoch][position]])
        batch = collate_left_pad(items, self.pad_token_id)
        batch.set(SAMPLE_ID, torch.tensor([int(i) for i in sample_ids], dtype=torch.long))
        return batch

    def _positions(self, batch_index: int, epoch_rows: int) -> list[int]:
        """This rank's positions in the epoch's order for global batch ``batch_index``: its
        run of ``batch_size / mini_batches`` rows out of each chunk, chunk by chunk."""
        share = self.batch_size // self.mini_batches
        chunk = share * self.num_ranks
        first = batch_index * self.batch_size * self.num_ranks
        positions = []
        for k in range(self.mini_batches):
            start = first + k * chunk + self.rank * share
            positions += range(start, min(start + share, epoch_rows))
        return positions

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "batches_done": self._batches_done, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict`; the dataset and batch size must be the same."""
        missing = {"epoch", "batches_done", "seed"} - set(state)
        if missing:
            raise DataError(f"loader state lacks {sorted(missing)}: {state}")
        epoch, done = int(state["epoch"]), int(state["batches_done"])
        if epoch < 0 or not 0 <= done <= len(self):
            raise DataError(f"loader state {state} does not fit this loader "
                            f"({len(self)} batches per epoch)")
        self._epoch, self._batches_done, self.seed = epoch, done, int(state["seed"])
        self._active = None
