"""Prompt datasets and the resumable, left-padding batch loader."""

from siirl.data_coordinator.dataloader.data_loader_node import (
    StatefulDataLoader,
    collate_left_pad,
    left_pad,
)
from siirl.data_coordinator.dataloader.partitioned_dataset import (
    PartitionedDataset,
    encode_text,
    read_rows,
    render_prompt,
)

__all__ = [
    "PartitionedDataset",
    "StatefulDataLoader",
    "collate_left_pad",
    "encode_text",
    "left_pad",
    "read_rows",
    "render_prompt",
]
