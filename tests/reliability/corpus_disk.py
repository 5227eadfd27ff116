"""The reliability corpus's disk faults (``cases.py`` lists every case)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from corpus_model import Case

# ---------------------------------------------------------------------------------------
# disk faults
# ---------------------------------------------------------------------------------------

def chmod(rel: str, mode: int) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        path = run / rel
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)
    return apply


def make_dir(rel: str) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        (run / rel).mkdir(parents=True, exist_ok=True)
    return apply


STORAGE = r"writ|permission|read-only|space|too large|not a directory|file exists"
DISK = [
    Case("disk_output_read_only", "disk", "`trainer.default_local_dir` is a read-only folder",
         "names the folder and that it cannot be written", (1, 2),
         message=(r"/run\b", STORAGE), damage=chmod(".", 0o555), unprivileged=True),
    Case("disk_output_is_file", "disk", "`trainer.default_local_dir` is a file",
         "names the path and that it is not a folder", (1, 2),
         message=(r"/run\b", r"director|folder|not a dir|exists"),
         argv=("trainer.default_local_dir={tmp}/run.txt",), files={"run.txt": "a file\n"}),
    Case("disk_output_under_file", "disk", "`trainer.default_local_dir` lies under a file",
         "names the path and that it is not a folder", (1, 2),
         message=(r"afile", r"director|folder|not a dir"),
         argv=("trainer.default_local_dir={tmp}/afile/run",), files={"afile": "a file\n"}),
    Case("disk_read_only_before_save", "disk",
         "the output folder turns read-only between runs; the resumed run saves every step",
         "says the checkpoint cannot be written: keeps training and says so, or stops; "
         "committed checkpoints intact", (0, 1), message=(r"checkpoint|global_step", STORAGE),
         argv=("trainer.total_training_steps=4", "trainer.save_freq=1"), seed=True,
         damage=chmod(".", 0o555), unprivileged=True, whole_stderr=True,
         checks=("committed_intact",)),
    Case("disk_file_size_limit", "disk",
         "a file-size limit (`ulimit -f`, 1.2 MB) that the optimizer state exceeds",
         "says the checkpoint cannot be written: keeps training and says so, or stops; no "
         "`.partial` left", (0, 1), message=(r"checkpoint|global_step", STORAGE),
         argv=("trainer.total_training_steps=2", "trainer.save_freq=1"),
         file_size_limit=1_200_000, whole_stderr=True),
    Case("disk_metrics_is_directory", "disk", "`metrics.jsonl` in the output folder is a folder",
         "names metrics.jsonl and that it cannot be written", (1, 2),
         message=(r"metrics\.jsonl",), damage=make_dir("metrics.jsonl")),
]
