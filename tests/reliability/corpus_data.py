"""The reliability corpus's bad data (``cases.py`` lists every case)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from corpus_model import Case, esc

# ---------------------------------------------------------------------------------------
# bad data: the file, the row and the column; an empty dataset names file and filter
# ---------------------------------------------------------------------------------------

def row(i: int, **change) -> dict:
    a, b = i % 17, (i * 7) % 13
    base = {"data_source": "arithmetic", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": "train", "index": i}}
    for key, value in change.items():
        if value is DROP:
            base.pop(key, None)
        else:
            base[key] = value
    return base


DROP = object()
ROWS = 64


def jsonl(rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def rows_with(bad_at: int, bad) -> str:
    """64 good rows with row ``bad_at`` replaced by ``bad`` (a dict, or a raw line)."""
    return jsonl(bad if i == bad_at else row(i) for i in range(ROWS))


def parquet(rows: list) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)

    return write


TRAIN = ("data.train_files={tmp}/train.jsonl",)
ROW_NAMED = "names the file, the row and the column"


def bad_row(cid: str, did: str, bad, column: str, row_no: int = 5) -> Case:
    return Case(cid, "data", did, ROW_NAMED, 2,
                message=(r"train\.jsonl", rf"row {row_no}\b", esc(column)), argv=TRAIN,
                files={"train.jsonl": rows_with(row_no, bad)})


DATA = [
    Case("data_malformed_json_line", "data", "a JSONL file with a broken line (row 5)",
         "names the file and the row", 2, message=(r"train\.jsonl", r"row 5\b"), argv=TRAIN,
         files={"train.jsonl": rows_with(5, '{"data_source": "arithmetic", "prompt": [')}),
    Case("data_not_utf8", "data", "a JSONL file with Latin-1 bytes in row 3",
         "names the file and the row (or byte offset) that is not UTF-8", 2,
         message=(r"train\.jsonl", r"utf-?8"), argv=TRAIN,
         files={"train.jsonl": rows_with(3, json.dumps(row(3)).replace(
             "arithmetic", "arithm\u00e9tique")).encode("latin-1")}),
    bad_row("data_missing_prompt", "a row without the `prompt` column",
            row(5, prompt=DROP), "prompt"),
    bad_row("data_prompt_is_string", "a row whose `prompt` is a string, not chat messages",
            row(5, prompt="13+5="), "prompt"),
    bad_row("data_message_without_role", "a chat message without `role`",
            row(5, prompt=[{"content": "13+5="}]), "role"),
    bad_row("data_missing_ground_truth", "a row without `reward_model.ground_truth`",
            row(5, reward_model={"style": "rule"}), "ground_truth"),
    bad_row("data_reward_model_is_int", "a row whose `reward_model` is a number",
            row(5, reward_model=7), "reward_model"),
    bad_row("data_source_not_string", "a row whose `data_source` is a number",
            row(5, data_source=123), "data_source"),
    Case("data_empty_file", "data", "an empty train file",
         "names the file and says it has no rows", 2,
         message=(r"train\.jsonl", r"empty|no rows|0 rows"), argv=TRAIN,
         files={"train.jsonl": ""}),
    Case("data_blank_lines_only", "data", "a train file of blank lines",
         "names the file and says it has no rows", 2,
         message=(r"train\.jsonl", r"empty|no rows|0 rows"), argv=TRAIN,
         files={"train.jsonl": "\n\n  \n"}),
    Case("data_all_filtered", "data",
         "every prompt longer than `data.max_prompt_length=2` with "
         "`data.filter_overlong_prompts=true`",
         "names the file and the filter that emptied it", 2,
         message=(r"train\.jsonl", r"filter_overlong_prompts|max_prompt_length"),
         argv=(*TRAIN, "data.filter_overlong_prompts=true", "data.max_prompt_length=2"),
         files={"train.jsonl": jsonl(row(i) for i in range(ROWS))}),
    Case("data_prompt_too_long", "data",
         "prompts longer than `data.max_prompt_length=2`, no filter",
         "names the file, the row and the limit", 2,
         message=(r"train\.jsonl", r"row 0\b", r"max_prompt_length"),
         argv=(*TRAIN, "data.max_prompt_length=2"),
         files={"train.jsonl": jsonl(row(i) for i in range(ROWS))}),
    Case("data_fewer_rows_than_batch", "data", "3 rows for a batch of 16 prompts",
         "names the file, its row count and the batch size", 2,
         message=(r"train\.jsonl", r"\b3\b", r"train_batch_size|16"), argv=TRAIN,
         files={"train.jsonl": jsonl(row(i) for i in range(3))}),
    Case("data_missing_file", "data", "`data.train_files` naming a file that does not exist",
         "names the path", 2, message=(r"missing\.parquet",),
         argv=("data.train_files={tmp}/missing.parquet",)),
    Case("data_directory", "data", "`data.train_files` naming a folder",
         "names the path", 2, message=(r"adir",),
         argv=("data.train_files={tmp}/adir",),
         files={"adir/README": "not a dataset\n"}),
    Case("data_parquet_wrong_schema", "data", "a parquet file with other columns",
         "names the file, the row and the missing column", 2,
         message=(r"train\.parquet", r"prompt"), argv=("data.train_files={tmp}/train.parquet",),
         files={"train.parquet": parquet([{"question": "1+1=", "answer": "2"}] * 32)}),
    Case("data_parquet_corrupt", "data", "a `.parquet` file that is not parquet",
         "names the file", 2, message=(r"train\.parquet", r"parquet"),
         argv=("data.train_files={tmp}/train.parquet",),
         files={"train.parquet": b"PAR1" + bytes(range(256)) * 8}),
    Case("data_unsupported_extension", "data", "a `.csv` train file",
         "names the file and the formats it reads", 2, message=(r"train\.csv", r"parquet"),
         argv=("data.train_files={tmp}/train.csv",), files={"train.csv": "a,b\n1,2\n"}),
    Case("data_prompt_key_absent", "data",
         "`data.prompt_key=question` on files with a `prompt` column",
         "names the file, the row and the `question` column", 2,
         message=(r"train\.jsonl", r"row 0\b", r"question"),
         argv=(*TRAIN, "data.prompt_key=question"),
         files={"train.jsonl": jsonl(row(i) for i in range(ROWS))}),
    Case("data_bad_val_file", "data", "a broken validation file (row 2)",
         "names the validation file and the row", 2, message=(r"val\.jsonl", r"row 2\b"),
         argv=(*TRAIN, "data.val_files={tmp}/val.jsonl"),
         files={"train.jsonl": jsonl(row(i) for i in range(ROWS)),
                "val.jsonl": rows_with(2, "not json at all")}),
    Case("data_unknown_data_source", "data",
         "rows of a `data_source` no built-in scorer knows, and no reward function",
         "names the data_source and how to give a reward function", 2,
         message=(r"my_task", r"custom_reward_function"), argv=TRAIN,
         files={"train.jsonl": jsonl(row(i, data_source="my_task") for i in range(ROWS))}),
]
