"""Reading the rows of one dataset file: parquet, JSON lines, or a JSON array.

A file that cannot be read raises ``DataError`` naming the file and, where the format has
them, the row (0-based, blank lines not counted) and the line: a row that is not JSON, bytes
that are not UTF-8, a parquet file that is damaged. Rows are returned as python objects,
unvalidated (``partitioned_dataset`` checks their columns).
"""

from __future__ import annotations

import json
import os
from typing import Any

from siirl.errors import DataError

__all__ = ["read_rows"]

PARQUET_EXT = (".parquet", ".pq")
JSON_EXT = (".jsonl", ".json")


def _rows_before(data: bytes, offset: int) -> int:
    """JSON-lines rows (non-blank lines) that end before byte ``offset``."""
    complete = data[:offset].split(b"\n")[:-1]
    return sum(1 for line in complete if line.strip())


def _decode(path: str, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")  # a byte-order mark some editors write is not a row
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        where = f"row {_rows_before(data, exc.start)} (line {line}, byte {exc.start})"
        raise DataError(f"{path}: {where}: not UTF-8 text ({exc.reason}: "
                        f"{data[exc.start:exc.end]!r}); save the file as UTF-8") from None


def _read_json_rows(path: str) -> list[Any]:
    with open(path, "rb") as fh:
        text = _decode(path, fh.read())
    if path.lower().endswith(".json") and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)  # a plain JSON array of rows
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
                            f"{exc.msg})") from None
        return rows
    rows = []
    # split on "\n" only: str.splitlines would also split on U+2028, valid inside a string
    for line_no, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue  # blank lines (e.g. a trailing newline) are not rows
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: row {len(rows)}: not valid JSON (line {line_no}, "
                            f"column {exc.colno}: {exc.msg})") from None
    return rows


def read_rows(path: str) -> list[Any]:
    """All rows of one parquet or JSON-lines file as python objects (unvalidated)."""
    if not os.path.isfile(path):
        kind = "a folder, not a" if os.path.isdir(path) else "not found: no such"
        raise DataError(f"dataset file {kind} file: {path}")
    lower = path.lower()
    if lower.endswith(PARQUET_EXT):
        import pyarrow.parquet as pq

        try:  # one file: ParquetFile, as read_table would also load pyarrow.dataset (~0.2 s)
            with pq.ParquetFile(path) as parquet:
                return parquet.read().to_pylist()
        except Exception as exc:  # pyarrow raises several types for a bad file
            raise DataError(f"{path}: cannot read parquet: {exc}") from None
    if lower.endswith(JSON_EXT):
        return _read_json_rows(path)
    raise DataError(f"{path}: unsupported file type (use .parquet, .jsonl or .json)")
