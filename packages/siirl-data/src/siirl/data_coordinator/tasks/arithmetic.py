"""Built-in task "arithmetic": ``a+b=`` / ``a-b=`` prompts small enough for a tiny model.

Rows follow verl's schema (``data_source``, ``prompt``, ``ability``, ``reward_model``,
``extra_info``). The parquet schema is explicit: ``reward_model`` and ``extra_info`` are
structs, so pyarrow and pandas readers (verl's ``RLHFDataset``) see them as dicts.

    python -m siirl.data_coordinator.tasks.arithmetic --out DIR [--train-size 2000]
        [--val-size 200] [--seed 0] [--low 0] [--high 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from siirl.errors import DataError

__all__ = ["DATA_SOURCE", "SCHEMA", "make_rows", "make_splits", "problem_space", "write_splits",
           "write_jsonl", "write_parquet"]

DATA_SOURCE = "arithmetic"
OPS = ("+", "-")

SCHEMA = pa.schema([
    pa.field("data_source", pa.string()),
    pa.field("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    pa.field("ability", pa.string()),
    pa.field("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
    pa.field("extra_info", pa.struct([
        ("split", pa.string()), ("index", pa.int64()), ("a", pa.int64()), ("b", pa.int64()),
        ("op", pa.string()),
    ])),
])

Problem = tuple[int, str, int]  # (a, op, b)


def problem_space(low: int = 0, high: int = 20, ops: Sequence[str] = OPS) -> list[Problem]:
    """Every problem with operands in ``[low, high]`` and a non-negative result, sorted."""
    if low < 0 or high < low:
        raise DataError(f"operand range must satisfy 0 <= low <= high, got {low}..{high}")
    bad = [op for op in ops if op not in OPS]
    if bad or not ops:
        raise DataError(f"ops must be a non-empty subset of {OPS}, got {list(ops)}")
    return [(a, op, b) for op in sorted(set(ops)) for a in range(low, high + 1)
            for b in range(low, high + 1) if op == "+" or a >= b]


def _answer(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def _row(problem: Problem, index: int, split: str) -> dict:
    a, op, b = problem
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{a}{op}{b}="}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(_answer(a, op, b))},
        "extra_info": {"split": split, "index": index, "a": a, "b": b, "op": op},
    }


def make_rows(n: int, seed: int = 0, low: int = 0, high: int = 20,
              ops: Sequence[str] = OPS, split: str = "train",
              exclude: Iterable[Problem] = ()) -> list[dict]:
    """``n`` rows, deterministic for ``seed``.

    Problems are drawn without repetition from the space minus ``exclude`` while it lasts
    (reshuffled for each further pass), so small ``n`` gives distinct problems. When
    ``exclude`` covers the whole space, the whole space is used instead.
    """
    if n < 0:
        raise DataError(f"number of rows must be >= 0, got {n}")
    space = problem_space(low, high, ops)
    excluded = set(exclude)
    pool = [p for p in space if p not in excluded] or space
    rng = random.Random(seed)
    chosen: list[Problem] = []
    while len(chosen) < n:
        batch = list(pool)
        rng.shuffle(batch)
        chosen.extend(batch[: n - len(chosen)])
    return [_row(p, i, split) for i, p in enumerate(chosen)]


def make_splits(train_size: int = 2000, val_size: int = 200, seed: int = 0, low: int = 0,
                high: int = 20, ops: Sequence[str] = OPS) -> tuple[list[dict], list[dict]]:
    """Train and val rows; val problems are distinct and never appear in train as long as
    val leaves some problems for train (otherwise train reuses the whole space)."""
    val = make_rows(val_size, seed + 1, low, high, ops, split="val")
    seen = {(r["extra_info"]["a"], r["extra_info"]["op"], r["extra_info"]["b"]) for r in val}
    train = make_rows(train_size, seed, low, high, ops, split="train", exclude=seen)
    return train, val


def write_parquet(rows: Sequence[dict], path: str | os.PathLike,
                  schema: pa.Schema = SCHEMA) -> None:
    """Rows in ``schema`` (any ``extra_info`` keys beyond its fields are dropped)."""
    path = os.path.expanduser(os.fspath(path))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # written aside and renamed: several workers may create the same file at once, and
    # none may ever read it half-written
    tmp = f"{path}.tmp-{os.getpid()}"
    pq.write_table(pa.Table.from_pylist(list(rows), schema=schema), tmp)
    os.replace(tmp, path)


def write_jsonl(rows: Sequence[dict], path: str | os.PathLike) -> None:
    """One JSON object per line, same fields as the parquet file."""
    path = os.path.expanduser(os.fspath(path))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m siirl.data_coordinator.tasks.arithmetic",
        description="Write train.parquet and val.parquet for the arithmetic task.")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--val-size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--low", type=int, default=0, help="smallest operand")
    parser.add_argument("--high", type=int, default=20, help="largest operand")
    args = parser.parse_args(argv)
    write_splits(*make_splits(args.train_size, args.val_size, args.seed, args.low, args.high),
                 args.out)


def write_splits(train: Sequence[dict], val: Sequence[dict], out: str,
                 schema: pa.Schema = SCHEMA) -> None:
    """A task's ``train.parquet`` and ``val.parquet`` in folder ``out`` (the CLIs')."""
    out = os.path.expanduser(out)
    write_parquet(train, os.path.join(out, "train.parquet"), schema=schema)
    write_parquet(val, os.path.join(out, "val.parquet"), schema=schema)
    print(f"wrote {len(train)} train and {len(val)} val rows to {out}")


if __name__ == "__main__":
    main()
