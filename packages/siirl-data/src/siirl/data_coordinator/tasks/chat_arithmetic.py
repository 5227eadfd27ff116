"""Built-in task "chat_arithmetic": the arithmetic task asked in words, for chat models.

``"What is 4 + 18? Answer with the number only."`` -> ``"22"``. The problems, splits and
seeds are the arithmetic task's (operands 0..20, ``+`` and ``-`` with non-negative results,
validation problems never in train); only the prompt and ``data_source`` differ. The reward
(``chat_arithmetic``) takes the response's *last* integer as its answer, so "4 + 18 = 22"
counts as the model writes it; SmolLM2-135M-Instruct often gets the sum wrong or starts
"To solve this problem, ..." and is cut off (``configs/grpo_smollm2.yaml``).

    python -m siirl.data_coordinator.tasks.chat_arithmetic --out DIR [--train-size 2000]
        [--val-size 200] [--seed 0]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from siirl.data_coordinator.tasks import arithmetic

__all__ = ["DATA_SOURCE", "PROMPT", "make_splits", "write_parquet"]

DATA_SOURCE = "chat_arithmetic"
# a user turn only: with the instruction as the system message (shorter prompts) SmolLM2
# starts lower still (greedy 0.04) and mostly begins "To solve this problem, ..."
PROMPT = "What is {a} {op} {b}? Answer with the number only."


def _in_words(row: dict) -> dict:
    info = row["extra_info"]
    content = PROMPT.format(a=info["a"], op=info["op"], b=info["b"])
    return {**row, "data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": content}]}


def make_splits(train_size: int = 2000, val_size: int = 200, seed: int = 0
                ) -> tuple[list[dict], list[dict]]:
    """The arithmetic task's splits (same problems for the same seed), asked in words."""
    train, val = arithmetic.make_splits(train_size, val_size, seed)
    return [_in_words(r) for r in train], [_in_words(r) for r in val]


def write_parquet(rows: Sequence[dict], path) -> None:
    """Rows in the arithmetic task's schema."""
    arithmetic.write_parquet(rows, path)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m siirl.data_coordinator.tasks.chat_arithmetic",
        description="Write train.parquet and val.parquet for the chat_arithmetic task.")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--val-size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    arithmetic.write_splits(*make_splits(args.train_size, args.val_size, args.seed), args.out)


if __name__ == "__main__":
    main()
