"""A run asked for more steps than its epochs hold says what caps it and the override that
lifts the cap, at start and when a resumed run finds nothing left to train."""

import pytest

import siirl_dagworker_helpers as h
from siirl.dag_worker.dagworker import DAGWorker
from siirl.dag_worker.walk.step_budget import StepBudget
from siirl.dag_worker.walk.trainer_loop import Trainer
from siirl.errors import ConfigError
from siirl.execution.dag.pipeline import Pipeline
from siirl.params.typed import to_typed


def _budget(epochs=8, explicit=None, per_epoch=62):
    config = {"trainer": {"total_epochs": epochs, "total_training_steps": explicit}}
    return StepBudget.of(to_typed(config), per_epoch)


def test_steps_are_the_smaller_of_the_epochs_and_total_training_steps():
    assert _budget().steps == 496
    assert _budget(explicit=500).steps == 496
    assert _budget(explicit=100).steps == 100
    assert _budget(explicit=7, per_epoch=None).steps == 7
    with pytest.raises(ConfigError, match="total_training_steps must be set"):
        _budget(per_epoch=None)


def test_total_training_steps_above_the_epochs_is_announced_with_the_fix():
    assert _budget(explicit=500).capped_notice() == (
        "siirl: trainer.total_training_steps=500 is capped by trainer.total_epochs=8 x 62 "
        "steps per epoch = 496 steps: this run ends at step 496; for 500 steps add "
        "trainer.total_epochs=9")
    assert _budget().capped_notice() is None
    assert _budget(explicit=496).capped_notice() is None
    assert _budget(explicit=100).capped_notice() is None


def test_a_finished_run_names_its_cap_and_the_override():
    assert _budget(explicit=500).finished_notice(496) == (
        "siirl: nothing left to train: the checkpoint is at step 496 and this run ends at "
        "step 496 (trainer.total_epochs=8 x 62 steps per epoch = 496 steps); to train on in "
        "this directory, add trainer.total_training_steps=500 trainer.total_epochs=9")
    # the same command again: one more epoch
    assert _budget().finished_notice(496).endswith(
        "add trainer.total_training_steps=558 trainer.total_epochs=9")
    capped = _budget(explicit=100).finished_notice(100)
    assert "ends at step 100 (trainer.total_training_steps=100)" in capped
    assert capped.endswith("add trainer.total_training_steps=162")  # the epochs hold it
    assert _budget(explicit=5, per_epoch=None).finished_notice(5).endswith(
        "add trainer.total_training_steps=105")


class _Loader:
    """Two batches per epoch, resumable."""

    def __init__(self):
        self.position = 0

    def __len__(self):
        return 2

    def __iter__(self):
        while self.position < 2:
            self.position += 1
            yield None
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


class _LoaderWorker(DAGWorker):
    def setup(self) -> None:
        super().setup()
        self.train_loader = _Loader()


def _run(tmp_path, **trainer):
    config = {"trainer": {"default_local_dir": str(tmp_path), "logger": [], "save_freq": 1,
                          "test_freq": -1, "val_before_train": False, **trainer}}
    graph = Pipeline("g").add_node("src", func="siirl_dagworker_helpers:source").build()
    worker = _LoaderWorker(graph, config)
    Trainer(worker).fit()
    h.CALLS.clear()
    return worker.global_step


def test_extending_a_finished_run_past_its_epochs_says_what_caps_it(tmp_path, capsys):
    assert _run(tmp_path, total_epochs=2) == 4
    assert "siirl:" not in capsys.readouterr().out
    assert _run(tmp_path, total_epochs=2, total_training_steps=6) == 4
    out = capsys.readouterr().out
    assert f"resumed from {tmp_path / 'global_step_4'} at step 4" in out
    assert ("siirl: nothing left to train: the checkpoint is at step 4 and this run ends at "
            "step 4 (trainer.total_epochs=2 x 2 steps per epoch = 4 steps); to train on in "
            "this directory, add trainer.total_training_steps=6 trainer.total_epochs=3") in out
    # the override it names does train on
    assert _run(tmp_path, total_epochs=3, total_training_steps=6) == 6
    assert "siirl:" not in capsys.readouterr().out


def test_a_fresh_run_capped_by_its_epochs_says_so_at_start(tmp_path, capsys):
    assert _run(tmp_path, total_epochs=1, total_training_steps=3) == 2
    assert "trainer.total_training_steps=3 is capped by trainer.total_epochs=1 x 2 steps " \
           "per epoch = 2 steps" in capsys.readouterr().out
