"""Embodied task manifests: (task, trial) rows capped by each task's initial states."""

import pyarrow.parquet as pq
import pytest

from siirl.data_coordinator.dataloader.embodied_preprocess import (
    task_rows,
    write_task_manifests,
)
from siirl.errors import DataError


def test_trials_are_capped_by_each_tasks_initial_states():
    rows = task_rows("reach", [50, 2, None], num_trials_per_task=3)
    assert [(r["task_id"], r["trial_id"]) for r in rows] == \
        [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
    assert rows[3]["prompt_id"] == "reach_1_0" and rows[0]["task_suite_name"] == "reach"


def test_manifests_are_written_for_training_and_validation(tmp_path):
    train, val = write_task_manifests("reach", [4, 4], 2, tmp_path / "data")
    for path in (train, val):
        table = pq.read_table(path).to_pylist()
        assert len(table) == 4 and table[-1] == {"task_suite_name": "reach", "task_id": 1,
                                                 "trial_id": 1, "prompt_id": "reach_1_1"}
    assert not list((tmp_path / "data").glob("*.partial"))


@pytest.mark.parametrize("states, trials, message", [
    ([3], 0, "at least 1 trial"), ([], 2, "has no tasks"), ([0, 0], 2, "no task has")])
def test_bad_settings_are_named(states, trials, message):
    with pytest.raises(DataError, match=message):
        task_rows("s", states, trials)
