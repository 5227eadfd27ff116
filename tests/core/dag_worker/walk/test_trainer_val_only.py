"""trainer.val_only: validate the policy once, log it, and train nothing (verl's meaning)."""

import json

import pytest

import siirl_dagworker_helpers as h
from siirl.dag_worker.dagworker import DAGWorker
from siirl.dag_worker.walk import trainer_loop
from siirl.dag_worker.walk.trainer_loop import Trainer
from siirl.errors import ConfigError
from siirl.execution.dag.pipeline import Pipeline

M = "siirl_dagworker_helpers:"


class _ValidatingWorker(DAGWorker):
    """A worker with a validation set (validation itself is stubbed below)."""

    def can_validate(self) -> bool:
        return True

    def setup(self) -> None:
        super().setup()
        self.val_loader = ["one validation batch"]


def _config(tmp_path, val_only):
    return {"trainer": {"total_training_steps": 3, "default_local_dir": str(tmp_path),
                        "logger": [], "save_freq": -1, "test_freq": 1,
                        "val_only": val_only}}


def _graph():
    return Pipeline("g").add_node("src", func=M + "source").build()


@pytest.fixture()
def validations(monkeypatch):
    calls = []

    def fake_validate(worker, loader):
        calls.append(loader)
        return {"val/score/mean": 0.5}

    monkeypatch.setattr(trainer_loop, "validate", fake_validate)
    h.CALLS.clear()
    yield calls
    h.CALLS.clear()


def test_val_only_validates_once_and_trains_nothing(tmp_path, validations):
    worker = _ValidatingWorker(_graph(), _config(tmp_path, True))
    history = Trainer(worker).fit()
    assert [(m["step"], m["val/score/mean"]) for m in history] == [(0, 0.5)]
    assert "timing_s/validation" in history[0]
    assert len(validations) == 1 and worker.global_step == 0
    assert h.CALLS == []  # the graph never ran
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0]


def test_without_val_only_the_same_run_trains(tmp_path, validations):
    worker = _ValidatingWorker(_graph(), _config(tmp_path, False))
    history = Trainer(worker).fit()
    assert worker.global_step == 3 and len(validations) == 4  # before training + every step
    assert [m["step"] for m in history if "timing_s/step" in m] == [1, 2, 3]


def test_val_only_with_nothing_to_validate_is_an_error(tmp_path, validations):
    worker = DAGWorker(_graph(), _config(tmp_path, True))  # no validation set
    with pytest.raises(ConfigError, match="trainer.val_only"):
        Trainer(worker).fit()
    assert worker.global_step == 0 and h.CALLS == []
