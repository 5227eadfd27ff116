"""Built-in task "repeat": ``ab*3=`` -> ``ababab``, with response lengths that have a long tail.

A unit of 1..4 letters (from ``abcd``, which every built-in tiny tokenizer has) is repeated
``k`` times, ``k`` in 1..10 drawn with probability proportional to ``k ** -tail`` (``tail`` 1
by default; unit lengths uniform): with the EOS, half the answers are at most 9 tokens, one in
ten is over 25 and the longest are 41. The slowest sample then holds
a whole generation batch up, the case asynchronous training is for.

Rows follow verl's schema like the arithmetic task's (``extra_info`` holds ``unit`` and
``k``). Validation problems are distinct and never appear in train; training rows are drawn
with replacement, so their lengths follow the long-tailed distribution.

    python -m siirl.data_coordinator.tasks.repeat --out DIR [--train-size 2000]
        [--val-size 200] [--seed 0] [--tail 1.0]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
from collections.abc import Iterable, Sequence

import pyarrow as pa

from siirl.data_coordinator.tasks import arithmetic
from siirl.errors import DataError

__all__ = ["ALPHABET", "DATA_SOURCE", "MAX_K", "MAX_UNIT", "SCHEMA", "make_rows",
           "make_splits", "problem_space", "problem_weights", "write_parquet"]

DATA_SOURCE = "repeat"
ALPHABET = "abcd"
MAX_UNIT = 4  # letters in a unit
MAX_K = 10  # repetitions
TAIL = 1.0  # P(k) ~ k ** -TAIL

SCHEMA = pa.schema([
    pa.field("data_source", pa.string()),
    pa.field("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    pa.field("ability", pa.string()),
    pa.field("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
    pa.field("extra_info", pa.struct([
        ("split", pa.string()), ("index", pa.int64()), ("unit", pa.string()), ("k", pa.int64()),
    ])),
])

Problem = tuple[str, int]  # (unit, k)


def problem_space() -> list[Problem]:
    """Every (unit, k), sorted: 340 units times 10 repetition counts."""
    units = ["".join(letters) for n in range(1, MAX_UNIT + 1)
             for letters in itertools.product(ALPHABET, repeat=n)]
    return [(unit, k) for unit in units for k in range(1, MAX_K + 1)]


def problem_weights(space: Sequence[Problem], tail: float = TAIL) -> list[float]:
    """Each problem's probability: P(k) ~ k ** -tail, unit length uniform, letters uniform."""
    if not tail >= 0:
        raise DataError(f"the repeat task's tail exponent must be >= 0, got {tail}")
    norm = sum(k ** -tail for k in range(1, MAX_K + 1))
    return [k ** -tail / norm / MAX_UNIT / len(ALPHABET) ** len(unit) for unit, k in space]


def _row(problem: Problem, index: int, split: str) -> dict:
    unit, k = problem
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{unit}*{k}="}],
        "ability": "copy",
        "reward_model": {"style": "rule", "ground_truth": unit * k},
        "extra_info": {"split": split, "index": index, "unit": unit, "k": k},
    }


def make_rows(n: int, seed: int = 0, tail: float = TAIL, split: str = "train",
              exclude: Iterable[Problem] = ()) -> list[dict]:
    """``n`` rows drawn with replacement by :func:`problem_weights` from the space minus
    ``exclude``; deterministic for ``seed``."""
    if n < 0:
        raise DataError(f"number of rows must be >= 0, got {n}")
    excluded = set(exclude)
    pool = [p for p in problem_space() if p not in excluded]
    if not pool:
        raise DataError("the repeat task's excluded problems cover its whole space")
    chosen = random.Random(seed).choices(pool, weights=problem_weights(pool, tail), k=n)
    return [_row(p, i, split) for i, p in enumerate(chosen)]


def distinct_rows(n: int, seed: int = 0, tail: float = TAIL, split: str = "val") -> list[dict]:
    """``n`` distinct problems drawn by weight without replacement (Efraimidis-Spirakis:
    the ``n`` largest ``u ** (1 / w)``), so the long tail shows in them too."""
    space = problem_space()
    if not 0 <= n <= len(space) // 2:
        raise DataError(f"the repeat task has {len(space)} problems; a distinct split takes "
                        f"0..{len(space) // 2} of them (the rest stay for training), got {n}")
    rng = random.Random(seed)
    keys = [rng.random() ** (1.0 / w) for w in problem_weights(space, tail)]
    order = sorted(range(len(space)), key=keys.__getitem__, reverse=True)[:n]
    return [_row(space[i], index, split) for index, i in enumerate(order)]


def make_splits(train_size: int = 2000, val_size: int = 200, seed: int = 0,
                tail: float = TAIL) -> tuple[list[dict], list[dict]]:
    """Train rows (with replacement) and distinct val rows; no val problem is in train."""
    val = distinct_rows(val_size, seed + 1, tail)
    seen = {(r["extra_info"]["unit"], r["extra_info"]["k"]) for r in val}
    train = make_rows(train_size, seed, tail, split="train", exclude=seen)
    return train, val


def write_parquet(rows: Sequence[dict], path: str | os.PathLike) -> None:
    """Rows in :data:`SCHEMA`, written as the arithmetic task's are (aside, then renamed)."""
    arithmetic.write_parquet(rows, path, schema=SCHEMA)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m siirl.data_coordinator.tasks.repeat",
        description="Write train.parquet and val.parquet for the repeat task.")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--val-size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tail", type=float, default=TAIL, help="P(k) ~ k ** -tail")
    args = parser.parse_args(argv)
    arithmetic.write_splits(*make_splits(args.train_size, args.val_size, args.seed,
                                         args.tail), args.out, schema=SCHEMA)


if __name__ == "__main__":
    main()
