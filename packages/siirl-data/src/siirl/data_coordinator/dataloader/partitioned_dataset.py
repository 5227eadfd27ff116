"""Prompt dataset in verl's parquet / JSON-lines schema, holding only this rank's rows.

Every rank reads, validates and tokenizes *all* rows (so overlong filtering and schema
errors are identical everywhere), then keeps its share. Partitioning rule: after
filtering, kept row ``j`` (0-based, in file-list order) belongs to rank
``j % world_size`` (round-robin), so shares differ by at most one row and the ranks
together cover every kept row exactly once. ``min_rank_rows`` (the smallest share) lets
:class:`StatefulDataLoader` with ``drop_last`` give every rank the same number of batches.

A bad row raises ``DataError`` naming the file, the row and the field; a dataset left with
no row names its files, their row counts and the filter that emptied it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from siirl.data_coordinator.dataloader.row_files import read_rows
from siirl.data_coordinator.fields import (
    ABILITY,
    DATA_SOURCE,
    EXTRA_INFO,
    GROUND_TRUTH,
    INDEX,
    INPUT_IDS,
    PROMPT_TEXT,
    RAW_PROMPT,
)
from siirl.data_coordinator.settings import DataArguments
from siirl.errors import ConfigError, DataError

__all__ = ["PartitionedDataset", "encode_text", "render_prompt", "read_rows"]

logger = logging.getLogger(__name__)

_TRUNCATION = ("error", "left", "right")


def _typed(data_config: DataArguments | None) -> DataArguments:
    """The typed ``data`` section (None: its defaults); a mapping is refused, so that every
    default is the one on its field."""
    if data_config is None:
        return DataArguments()
    if isinstance(data_config, Mapping):  # a dict or DictConfig
        raise ConfigError(f"PartitionedDataset reads the typed data section "
                          f"(siirl.data_coordinator.settings.DataArguments, as the run's "
                          f"config.data), not a {type(data_config).__name__}: pass "
                          f"DataArguments(**settings) or config.data")
    return data_config


def _as_paths(files: str | os.PathLike | Sequence) -> list[str]:
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    paths = [os.path.expanduser(os.fspath(f)) for f in files]
    if not paths:
        raise DataError("no dataset files given")
    return paths


def _check_messages(value: Any, where: str, field: str) -> list[dict]:
    if not isinstance(value, (list, tuple)) or not value:
        raise DataError(f"{where}: field {field!r} must be a non-empty list of chat "
                        f"messages {{role, content}}, got {type(value).__name__}")
    messages = []
    for k, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise DataError(f"{where}: field {field!r}[{k}] must be a dict with 'role' and "
                            f"'content', got {type(msg).__name__}")
        for part in ("role", "content"):
            if not isinstance(msg.get(part), str):
                raise DataError(f"{where}: field {field!r}[{k}].{part} must be a string, "
                                f"got {type(msg.get(part)).__name__}")
        messages.append(dict(msg))
    return messages


def _as_dict(value: Any, where: str, field: str) -> dict:
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        return dict(value)  # a parquet map column reads as a list of (key, value) pairs
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            parsed = json.loads(value)  # some writers store extra_info as a JSON string
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    raise DataError(f"{where}: field {field!r} must be a dict, got {type(value).__name__}")


def _validate(row: Any, where: str, prompt_key: str) -> dict:
    """The row's fields checked and normalised; DataError names file, row and field."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: row must be an object/dict, got {type(row).__name__}")
    for field in (prompt_key, "data_source", "ability", "reward_model"):
        if row.get(field) is None:
            hint = " (data.prompt_key names the column of chat messages)" \
                if field == prompt_key else ""
            # a parquet row holds every column of the file: name those with a value
            present = ", ".join(repr(k) for k in sorted(row) if row[k] is not None) or "none"
            raise DataError(f"{where}: missing required field {field!r} (the row's fields: "
                            f"{present}){hint}")
    messages = _check_messages(row[prompt_key], where, prompt_key)
    for field in ("data_source", "ability"):
        if not isinstance(row[field], str):
            raise DataError(f"{where}: field {field!r} must be a string, "
                            f"got {type(row[field]).__name__}")
    reward = _as_dict(row["reward_model"], where, "reward_model")
    if reward.get("ground_truth") is None:
        raise DataError(f"{where}: missing required field 'reward_model.ground_truth'")
    return {
        RAW_PROMPT: messages,
        DATA_SOURCE: row["data_source"],
        ABILITY: row["ability"],
        GROUND_TRUTH: reward["ground_truth"],
        EXTRA_INFO: _as_dict(row.get("extra_info"), where, "extra_info"),
    }


def render_prompt(tokenizer: Any, messages: list[dict], template_kwargs: dict | None = None
                  ) -> str:
    """Prompt text: the tokenizer's chat template if it has one, else contents joined by \\n."""
    if getattr(tokenizer, "chat_template", None) and hasattr(tokenizer, "apply_chat_template"):
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **(template_kwargs or {})
        )
    return "\n".join(m["content"] for m in messages)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids without extra special tokens (the chat template already adds them)."""
    if hasattr(tokenizer, "encode"):
        try:
            ids = tokenizer.encode(text, add_special_tokens=False)
        except TypeError:  # a duck-typed tokenizer whose encode takes only the text
            ids = tokenizer.encode(text)
    else:
        try:
            out = tokenizer(text, add_special_tokens=False)
        except TypeError:
            out = tokenizer(text)
        ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    if isinstance(ids, torch.Tensor):
        ids = ids.reshape(-1).tolist()
    return [int(i) for i in ids]


class PartitionedDataset:
    """This rank's rows of one or more prompt files, tokenized (``input_ids`` unpadded).

    ``data_config`` is the typed ``data`` section (:class:`DataArguments`; None: its
    defaults), of which it reads ``prompt_key``, ``max_prompt_length``,
    ``filter_overlong_prompts``, ``truncation`` ("error" | "left" | "right") and
    ``apply_chat_template_kwargs``. ``raw_prompt`` is always returned because the batch
    contract lists it (verl's ``return_raw_chat`` has no effect).
    ``prompt_text`` is the full rendered prompt, before any truncation.
    """

    def __init__(self, files: str | os.PathLike | Sequence, tokenizer: Any,
                 data_config: DataArguments | None = None, rank: int = 0,
                 world_size: int = 1):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"need 0 <= rank < world_size, got rank={rank}, "
                              f"world_size={world_size}")
        self.files = _as_paths(files)
        self.tokenizer = tokenizer
        self.rank, self.world_size = rank, world_size
        data_config = _typed(data_config)
        self.prompt_key = data_config.prompt_key
        self.max_prompt_length = data_config.max_prompt_length
        self.filter_overlong = data_config.filter_overlong_prompts
        self.truncation = data_config.truncation
        template_kwargs = dict(data_config.apply_chat_template_kwargs)
        if self.truncation not in _TRUNCATION:
            raise ConfigError(f"data.truncation must be one of {_TRUNCATION}, "
                              f"got {self.truncation!r}")

        kept: list[dict] = []
        self.file_counts: list[tuple[str, int, int]] = []  # (path, rows, filtered)
        for path in self.files:
            kept += self._load_file(path, template_kwargs, first_index=sum(
                rows for _, rows, _ in self.file_counts))
        self.num_filtered = sum(filtered for _, _, filtered in self.file_counts)
        if self.filter_overlong:
            logger.info("filtered %d of %d prompts longer than %d tokens from %s",
                        self.num_filtered, sum(rows for _, rows, _ in self.file_counts),
                        self.max_prompt_length, self.files)
        if not kept:
            raise DataError(self._empty_message())
        self.num_rows_total = len(kept)  # kept rows over all ranks
        # the smallest rank's share: loaders with drop_last use it so that every rank
        # yields the same number of batches per epoch (collectives stay in step)
        self.min_rank_rows = len(kept) // world_size
        self._items = kept[rank::world_size]
        for item in self._items:  # tensors only for the rows this rank keeps
            item[INPUT_IDS] = torch.tensor(item[INPUT_IDS], dtype=torch.long)

    def _load_file(self, path: str, template_kwargs: dict, first_index: int) -> list[dict]:
        """The kept rows of one file, validated and tokenized; counts its rows and the
        overlong ones filtered."""
        kept, filtered, rows = [], 0, read_rows(path)
        for row_no, row in enumerate(rows):
            where = f"{path}: row {row_no}"
            item = _validate(row, where, self.prompt_key)
            try:
                item[PROMPT_TEXT] = render_prompt(self.tokenizer, item[RAW_PROMPT],
                                                  template_kwargs)
            except Exception as exc:  # a chat template rejects these messages (jinja)
                raise DataError(f"{where}: field {self.prompt_key!r}: the tokenizer's chat "
                                f"template cannot render these messages: "
                                f"{type(exc).__name__}: {exc}") from None
            ids = encode_text(self.tokenizer, item[PROMPT_TEXT])
            item[INDEX] = first_index + row_no
            if len(ids) > self.max_prompt_length:
                if self.filter_overlong:
                    filtered += 1
                    continue
                ids = self._truncate(ids, where)
            item[INPUT_IDS] = ids
            kept.append(item)
        self.file_counts.append((path, len(rows), filtered))
        return kept

    def _counts(self) -> str:
        """'a.jsonl: 64 rows, 64 filtered; b.jsonl: 0 rows' (filtered: longer than the
        prompt limit, with data.filter_overlong_prompts)."""
        return "; ".join(f"{path}: {rows} rows" + (f", {filtered} filtered"
                                                    if self.filter_overlong else "")
                         for path, rows, filtered in self.file_counts)

    def _empty_message(self) -> str:
        if not self.num_filtered:
            return (f"no rows in the dataset ({self._counts()}): each file is empty or holds "
                    "only blank lines")
        return (f"no prompt is left in the dataset ({self._counts()}): data.filter_overlong_"
                f"prompts=true removed all {self.num_filtered} rows, whose prompts are longer "
                f"than data.max_prompt_length={self.max_prompt_length} tokens; raise "
                "data.max_prompt_length, or set data.filter_overlong_prompts=false and "
                "data.truncation=left or right")

    def describe(self) -> str:
        """The files and their row counts, for messages about the dataset as a whole."""
        return self._counts()

    def _truncate(self, ids: list[int], where: str) -> list[int]:
        limit = self.max_prompt_length
        if self.truncation == "left":
            return ids[-limit:] if limit > 0 else []
        if self.truncation == "right":
            return ids[:limit]
        raise DataError(f"{where}: field {self.prompt_key!r}: the prompt has {len(ids)} "
                        f"tokens, more than data.max_prompt_length={limit} (set "
                        "data.filter_overlong_prompts=true or data.truncation=left/right)")

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> dict:
        # a shallow copy, so a caller adding keys does not change the dataset
        return dict(self._items[i])

    def __repr__(self) -> str:
        return (f"PartitionedDataset(files={self.files}, rows={len(self)}, rank={self.rank}/"
                f"{self.world_size}, filtered={self.num_filtered})")
