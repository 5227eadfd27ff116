"""Data coordinator: the batch protocol shared by every stage of a siiRL pipeline."""

from siirl.data_coordinator.protocol import (
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
