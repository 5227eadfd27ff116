"""Embodied datasets: a task suite and its trials become prompt rows (siiRL's manifests).

An embodied episode needs no text from a file: a row names the task and the trial (the
initial state, or seed) the environment starts from. ``write_task_manifests`` writes the
same rows to ``train.parquet`` and ``validate.parquet``: for each task, trials ``0 ..
min(initial states, num_trials_per_task) - 1``, with ``prompt_id`` ``<suite>_<task>_<trial>``
(siiRL's columns: ``task_suite_name``, ``task_id``, ``trial_id``, ``prompt_id``). The caller
says how many initial states each task has (a simulator suite knows; a generated task has as
many as asked for), so this module needs no simulator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import pyarrow as pa
import pyarrow.parquet as pq

from siirl.errors import DataError

COLUMNS = ("task_suite_name", "task_id", "trial_id", "prompt_id")


def task_rows(task_suite_name: str, initial_states: Sequence[Optional[int]],
              num_trials_per_task: int) -> List[Dict[str, Union[str, int]]]:
    """One row per (task, trial); ``initial_states[t]`` caps task t's trials (None: no cap)."""
    if int(num_trials_per_task) < 1:
        raise DataError(f"num_trials_per_task={num_trials_per_task}: at least 1 trial per "
                        "task is needed")
    if not initial_states:
        raise DataError(f"task suite '{task_suite_name}' has no tasks")
    rows = []
    for task_id, states in enumerate(initial_states):
        trials = int(num_trials_per_task) if states is None else \
            min(int(states), int(num_trials_per_task))
        rows += [{"task_suite_name": task_suite_name, "task_id": task_id, "trial_id": trial,
                  "prompt_id": f"{task_suite_name}_{task_id}_{trial}"}
                 for trial in range(trials)]
    if not rows:
        raise DataError(f"task suite '{task_suite_name}': no task has an initial state")
    return rows


def write_task_manifests(task_suite_name: str, initial_states: Sequence[Optional[int]],
                         num_trials_per_task: int, dataset_dir: Union[str, Path]
                         ) -> Tuple[Path, Path]:
    """Write ``train.parquet`` and ``validate.parquet`` (the same rows) under
    ``dataset_dir``; return their paths."""
    rows = task_rows(task_suite_name, initial_states, num_trials_per_task)
    folder = Path(dataset_dir)
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({column: [row[column] for row in rows] for column in COLUMNS})
    paths = (folder / "train.parquet", folder / "validate.parquet")
    for path in paths:
        partial = path.with_suffix(".parquet.partial")  # never leave half a file behind
        pq.write_table(table, partial)
        partial.replace(path)
    return paths
