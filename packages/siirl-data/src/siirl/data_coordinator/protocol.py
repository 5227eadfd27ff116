"""The batch protocol: one ``TensorDict`` with ``batch_size=[B]`` carries a whole batch.

Tensor fields (``input_ids``, ``attention_mask``, ``responses``, ...) have first dim B.
Per-row python values (prompt text, ground truth, ``extra_info`` dicts, group ``uid``
strings) live in the same TensorDict as a ``NonTensorStack`` of B ``NonTensorData``
items, so indexing, slicing, ``torch.cat``, ``split`` and ``repeat_interleave`` move
them together with the tensors, and pickling keeps them.

The stack is built one ``NonTensorData`` per row whenever a row holds a container:
``NonTensorStack.from_list`` turns equal-length nested lists into a 2-D stack, so a row
holding a list would change the field's shape. Columns of plain scalars (strings,
numbers, None) use ``from_list``, which builds the same 1-D stack faster.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict
from tensordict.utils import is_non_tensor

from siirl.data_coordinator.fields import ATTENTION_MASK, UID
from siirl.errors import DataError

__all__ = [
    "batch_num_tokens",
    "chunk",
    "concat",
    "get_non_tensor",
    "group_indices",
    "make_batch",
    "merge",
    "non_tensor_keys",
    "repeat_interleave",
    "select_rows",
    "set_non_tensor",
    "split",
    "tensor_keys",
]


_SCALARS = (str, int, float, bool, type(None))


def _to_stack(values: Sequence) -> NonTensorStack:
    # from_list is safe (and ~2.5x faster) when no row holds a nested value; see above.
    if all(isinstance(v, _SCALARS) for v in values):
        return NonTensorStack.from_list(list(values))
    # NonTensorStack() with no items already has batch_size [0], so B=0 needs no branch.
    return NonTensorStack(*[NonTensorData(data=v) for v in values])


def _rows(batch: TensorDict) -> int:
    return batch.batch_size[0] if batch.batch_size else 0


def make_batch(
    tensors: dict[str, torch.Tensor] | None = None,
    non_tensors: dict[str, list] | None = None,
    batch_size: int | None = None,
) -> TensorDict:
    """Build a batch from tensor fields and per-row python-value fields.

    ``batch_size`` defaults to the first dim of the first tensor, else the length of the
    first list. Every tensor's first dim and every list's length must equal it; a
    mismatch raises :class:`DataError` naming the field and both lengths.
    """
    tensors = tensors or {}
    non_tensors = non_tensors or {}
    if batch_size is None:
        first_t = next(iter(tensors.values()), None)
        first_l = next(iter(non_tensors.values()), None)
        if first_t is not None:
            batch_size = first_t.shape[0] if first_t.dim() > 0 else 0
        elif first_l is not None:
            batch_size = len(first_l)
        else:
            raise DataError("make_batch needs batch_size when no field is given")
    out = TensorDict({}, batch_size=[batch_size])
    for key, value in tensors.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            raise DataError(f"field {key!r} must be a tensor with a batch dim, got {value!r}")
        if value.shape[0] != batch_size:
            raise DataError(
                f"field {key!r} has first dim {value.shape[0]}, expected batch size {batch_size}"
            )
        out.set(key, value)
    for key, values in non_tensors.items():
        set_non_tensor(out, key, values)
    return out


def get_non_tensor(batch: TensorDict, key: str) -> list:
    """Return the per-row python values of a non-tensor field as a list of length B.

    The objects are the stored ones, not copies: rows produced by ``repeat_interleave``
    share one object, so mutate a dict value only after copying it.
    """
    if key not in batch:
        raise DataError(f"batch has no field {key!r}; fields: {sorted(batch.keys())}")
    value = batch.get(key)
    if not is_non_tensor(value):
        raise DataError(f"field {key!r} is a tensor field, not a non-tensor one")
    # A NonTensorData with batch_size [B] (one value broadcast over rows, e.g. written by
    # TensorDict.set_non_tensor) also gives B items here.
    out = value.tolist()
    return list(out) if isinstance(out, list) else [out] * _rows(batch)


def set_non_tensor(batch: TensorDict, key: str, values: Sequence) -> None:
    """Set or replace the per-row non-tensor field ``key`` (in place); length must be B."""
    if isinstance(values, (str, bytes, torch.Tensor)) or not isinstance(values, Sequence):
        raise DataError(f"field {key!r} needs a list of per-row values, got {type(values)}")
    if len(values) != _rows(batch):
        raise DataError(
            f"field {key!r} has {len(values)} values, expected batch size {_rows(batch)}"
        )
    # set() (inplace=False) swaps the entry, so a stack shared with another batch is
    # left untouched, and a tensor entry of the same name is replaced too.
    batch.set(key, _to_stack(values))


def non_tensor_keys(batch: TensorDict) -> list[str]:
    """Names of the per-row python-value fields, in insertion order."""
    # .keys() is needed: iterating a TensorDict yields its rows, not its keys.
    return [k for k in batch.keys() if is_non_tensor(batch.get(k))]  # noqa: SIM118


def tensor_keys(batch: TensorDict) -> list[str]:
    """Names of the tensor fields, in insertion order."""
    return [k for k in batch.keys() if isinstance(batch.get(k), torch.Tensor)]  # noqa: SIM118


def repeat_interleave(batch: TensorDict, n: int, uid_key: str = UID) -> TensorDict:
    """Repeat each row ``n`` times consecutively (row0, row0, row1, row1, ...).

    If ``uid_key`` is absent, each original row first gets a fresh ``uuid4`` string, so
    the ``n`` samples of one prompt share one group id; an existing uid is repeated. The
    input batch is not modified.
    """
    if n < 1:
        raise DataError(f"repeat_interleave needs n >= 1, got {n}")
    if uid_key not in batch:
        batch = batch.copy()  # shallow: adds the uid field without touching the caller's
        set_non_tensor(batch, uid_key, [str(uuid.uuid4()) for _ in range(_rows(batch))])
    return batch.repeat_interleave(n, dim=0)


def concat(batches: Sequence[TensorDict]) -> TensorDict:
    """Concatenate batches along dim 0, all fields; every batch must have the same keys."""
    if not batches:
        raise DataError("concat needs at least one batch")
    all_keys = set().union(*(set(b.keys()) for b in batches))
    problems = [
        f"batch {i} lacks {sorted(all_keys - set(b.keys()))}"
        for i, b in enumerate(batches)
        if set(b.keys()) != all_keys
    ]
    if problems:
        raise DataError("concat needs the same fields in every batch: " + "; ".join(problems))
    return torch.cat(list(batches), dim=0)


def left_pad_to(batch: TensorDict, widths: dict[str, int], pad_values: dict[str, int]
                ) -> TensorDict:
    """A shallow copy of ``batch`` whose fields named in ``widths`` are left-padded (with
    ``pad_values[key]``, default 0) to at least that trailing width."""
    out = None
    for key, width in widths.items():
        if key not in batch.keys() or batch.get(key).shape[-1] >= width:
            continue
        tensor = batch.get(key)
        pad = tensor.new_full((*tensor.shape[:-1], width - tensor.shape[-1]),
                              pad_values.get(key, 0))
        out = out if out is not None else batch.copy()
        out.set(key, torch.cat([pad, tensor], dim=-1))
    return out if out is not None else batch


def concat_left_padded(batches: Sequence[TensorDict], pad_values: dict[str, int]
                       ) -> TensorDict:
    """``concat`` for batches padded to different widths (prompts are left-padded to the
    longest prompt of their own batch): each 2-D tensor field named in ``pad_values`` is
    left-padded with its value to the widest batch first; ``position_ids``-style fields pad
    with 0, like the loader. Other fields must already agree."""
    batches = list(batches)
    for key, value in pad_values.items():
        present = [b for b in batches if key in b.keys()]
        if len(present) < 2:
            continue
        width = max(b.get(key).shape[-1] for b in present)
        for i, b in enumerate(batches):
            if key not in b.keys() or b.get(key).shape[-1] == width:
                continue
            tensor = b.get(key)
            pad = tensor.new_full((*tensor.shape[:-1], width - tensor.shape[-1]), value)
            batches[i] = b.copy()
            batches[i].set(key, torch.cat([pad, tensor], dim=-1))
    return concat(batches)


def split(batch: TensorDict, split_size: int) -> list[TensorDict]:
    """Split into chunks of ``split_size`` rows; the last one may be smaller."""
    if split_size < 1:
        raise DataError(f"split needs split_size >= 1, got {split_size}")
    if _rows(batch) == 0:
        return [batch[0:0]]
    return list(batch.split(split_size, dim=0))


def chunk(batch: TensorDict, chunks: int) -> list[TensorDict]:
    """Split into ``chunks`` equal parts; B must be divisible by ``chunks``."""
    rows = _rows(batch)
    if chunks < 1 or rows % chunks != 0:
        raise DataError(f"cannot chunk a batch of {rows} rows into {chunks} equal parts")
    if rows == 0:
        return [batch[0:0] for _ in range(chunks)]
    return list(batch.split(rows // chunks, dim=0))


def select_rows(batch: TensorDict, index: Sequence[int] | torch.Tensor) -> TensorDict:
    """Rows picked by a list of ints, a long tensor or a bool mask, in that order."""
    if not isinstance(index, torch.Tensor):
        index = torch.as_tensor(list(index), dtype=torch.long)
    if index.dim() != 1:
        raise DataError(f"select_rows needs a 1-D index, got shape {tuple(index.shape)}")
    return batch[index]


def merge(batches: Sequence[TensorDict]) -> TensorDict:
    """Union of the fields of batches with the same batch size; the later batch wins.

    Used where a DAG node has several parents. The inputs are not modified; the result
    shares their tensors (no copy), like a shallow dict update.
    """
    if not batches:
        raise DataError("merge needs at least one batch")
    rows = _rows(batches[0])
    for i, b in enumerate(batches[1:], start=1):
        if _rows(b) != rows:
            raise DataError(
                f"merge needs equal batch sizes: batch 0 has {rows}, batch {i} has {_rows(b)}"
            )
    devices = {b.device for b in batches}
    out = TensorDict({}, batch_size=[rows], device=devices.pop() if len(devices) == 1 else None)
    for b in batches:
        for key in b.keys():  # noqa: SIM118 (iterating a TensorDict gives rows)
            # set() replaces the entry (never copies into it), so the inputs stay intact
            out.set(key, b.get(key))
    return out


def group_indices(batch: TensorDict, uid_key: str = UID) -> dict[str, list[int]]:
    """Row indices of each group, groups in order of first appearance."""
    value = batch.get(uid_key, None)
    if value is None:
        raise DataError(f"batch has no group field {uid_key!r}")
    uids = value.tolist() if isinstance(value, torch.Tensor) else get_non_tensor(batch, uid_key)
    groups: dict[str, list[int]] = {}
    for i, uid in enumerate(uids):
        groups.setdefault(uid, []).append(i)
    return groups


def batch_num_tokens(batch: TensorDict, mask_key: str = ATTENTION_MASK) -> torch.Tensor:
    """Per-row token counts: the ``mask_key`` mask summed over dim 1 (long tensor [B])."""
    mask = batch.get(mask_key, None)
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise DataError(f"batch_num_tokens needs a 2-D tensor field {mask_key!r}")
    return mask.to(torch.long).sum(dim=1)
