"""Data coordinator: the batch protocol shared by every stage of a siiRL pipeline.

The protocol's names are re-exported lazily (PEP 562): importing a light submodule such as
``siirl.data_coordinator.fields`` must not import tensordict, and with it torch and its
compiler stack (seconds), e.g. in a multi-worker job's driver, which never holds a batch.
"""

import importlib
from typing import Any

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


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("siirl.data_coordinator.protocol"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
