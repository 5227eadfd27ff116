"""metrics.jsonl has each step once after any number of resumes (issue 16, item 6)."""

import json

import pytest
from omegaconf import OmegaConf

from siirl.dag_worker.checkpoint.errors import StorageError
from siirl.dag_worker.walk.tracking import JsonlLogger, build_tracking, truncate_records


def steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def log(directory, keep_through, numbers):
    logger = JsonlLogger(str(directory), keep_through)
    for step in numbers:
        logger.log(step, {"x": float(step)})
    logger.close()


def test_each_step_once_after_several_resumes(tmp_path):
    log(tmp_path, -1, [1, 2, 3, 4, 5])  # killed after step 5, last checkpoint at 4
    log(tmp_path, 4, [5, 6, 7])  # killed after 7, checkpoint at 6
    log(tmp_path, 6, [7, 8])
    assert steps(tmp_path / "metrics.jsonl") == [1, 2, 3, 4, 5, 6, 7, 8]


def test_records_of_the_resumed_step_stay_and_a_torn_line_goes(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n{"step": 2, "val/x": 0.5}\n'
                    '{"step": 3, "x": 3}\n{"step": 4, "x"')  # the crash cut the last line
    assert truncate_records(str(path), 2) == 2  # step 3 and the torn line
    assert steps(path) == [1, 2, 2]


def test_a_fresh_start_drops_an_earlier_attempt_and_none_appends(tmp_path):
    log(tmp_path, None, [1, 2])
    log(tmp_path, None, [3])
    assert steps(tmp_path / "metrics.jsonl") == [1, 2, 3]
    log(tmp_path, -1, [1])
    assert steps(tmp_path / "metrics.jsonl") == [1]


def test_build_tracking_truncates_to_the_resumed_step(tmp_path):
    config = OmegaConf.create({"trainer": {"logger": [], "default_local_dir": str(tmp_path)}})
    log(tmp_path, -1, [1, 2, 3])
    tracking = build_tracking(config, keep_through=1)
    tracking.log(2, {"x": 2.0})
    tracking.close()
    assert steps(tmp_path / "metrics.jsonl") == [1, 2]


def test_metrics_path_that_is_a_folder_is_a_storage_error_naming_it(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(StorageError, match=r"metrics\.jsonl cannot be written"):
        JsonlLogger(str(tmp_path), 0)
