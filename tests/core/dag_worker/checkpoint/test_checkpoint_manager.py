"""Which checkpoint the manager resumes from, what it prunes, and how it saves (issue 16,
items 4, 5 and 8).

The engines here are fakes that write one file per piece and record what they loaded,
so each test says exactly which checkpoint was chosen. The step numbers 2, 9, 10 make
a string sort ("global_step_9" > "global_step_10") pick the wrong one.
"""

import io
import json
import re
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from siirl.dag_worker.checkpoint import storage as checkpoint_storage
from siirl.dag_worker.checkpoint.errors import (
    CheckpointError,
    DamagedCheckpointError,
    StorageError,
)
from siirl.dag_worker.checkpoint.manager import MARKER, CheckpointManager
from siirl.dag_worker.checkpoint.manifest import MANIFEST
from siirl.errors import ConfigError


class FakeEngine:
    """Weights (the step, 4 KB of them) and optimizer state as two files."""

    def __init__(self):
        self.step = 0
        self.loaded = []

    def save_checkpoint(self, directory):
        Path(directory).mkdir(parents=True)
        Path(directory, "weights.bin").write_bytes(bytes([self.step % 256]) * 4096)
        torch.save({"step": self.step}, Path(directory, "optimizer.pt"))

    def load_checkpoint(self, directory):
        if not Path(directory, "optimizer.pt").is_file():
            raise DamagedCheckpointError(f"checkpoint {directory} has no optimizer.pt")
        self.step = torch.load(Path(directory, "optimizer.pt"), weights_only=True)["step"]
        self.loaded.append(Path(directory).parent.name)


def state(step, dataloader=True):
    return {"global_step": step, "rng": {"seed": 1},
            "dataloader": {"epoch": 0, "batches_done": step} if dataloader else None}


def make(tmp_path, steps=(2, 9, 10), keep=None):
    manager = CheckpointManager(str(tmp_path), keep, stream=io.StringIO())
    engine = FakeEngine()
    for step in steps:
        engine.step = step
        manager.save(step, {"actor": engine}, state(step))
    return manager


def resume(manager, **kwargs):
    engine = FakeEngine()
    found = manager.restore({"actor": engine}, needs_dataloader=True, **kwargs)
    return found, engine


def warnings_of(manager):
    return manager.stream.getvalue()


# ---- the newest complete checkpoint ---------------------------------------------------

def test_newest_committed_checkpoint_is_chosen_by_number_not_name(tmp_path):
    manager = make(tmp_path)
    # a newer folder that never committed (a crash mid-save, then the rename by hand)
    shutil.copytree(tmp_path / "global_step_10", tmp_path / "global_step_11")
    (tmp_path / "global_step_11" / MARKER).unlink()
    assert manager.committed_steps() == [2, 9, 10]
    assert manager.latest() == tmp_path / "global_step_10"
    (folder, got), engine = resume(manager)
    assert folder == tmp_path / "global_step_10"
    assert got["global_step"] == 10 and engine.loaded == ["global_step_10"]
    assert warnings_of(manager) == ""


def test_a_folder_without_committed_is_never_resumed(tmp_path):
    manager = make(tmp_path, steps=(2,))
    shutil.copytree(tmp_path / "global_step_2", tmp_path / "global_step_3")
    (tmp_path / "global_step_3" / MARKER).unlink()
    (folder, _), engine = resume(manager)
    assert folder.name == "global_step_2" and engine.loaded == ["global_step_2"]


def test_nothing_to_resume_starts_fresh(tmp_path):
    manager = CheckpointManager(str(tmp_path / "run"), stream=io.StringIO())
    found, engine = resume(manager)
    assert found is None and engine.loaded == []


# ---- pruning --------------------------------------------------------------------------

@pytest.mark.parametrize("keep, kept", [(1, [5]), (2, [4, 5]), (3, [3, 4, 5]),
                                        (None, [1, 2, 3, 4, 5]), (0, [1, 2, 3, 4, 5])])
def test_pruning_keeps_exactly_max_to_keep(tmp_path, keep, kept):
    manager = make(tmp_path, steps=(1, 2, 3, 4, 5), keep=keep)
    assert manager.committed_steps() == kept
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == \
        sorted(f"global_step_{s}" for s in kept)


def test_pruning_counts_numerically_and_keeps_the_one_just_written(tmp_path):
    manager = make(tmp_path, steps=(2, 9, 10), keep=2)
    assert manager.committed_steps() == [9, 10]
    # a run resumed from step 10 while a newer checkpoint (say a damaged 30) is there:
    # the checkpoint it just wrote is never the one pruned
    shutil.copytree(tmp_path / "global_step_10", tmp_path / "global_step_30")
    engine = FakeEngine()
    engine.step = 11
    manager.save(11, {"actor": engine}, state(11))
    assert manager.committed_steps() == [10, 11, 30]


# ---- resume_mode ----------------------------------------------------------------------

def test_resume_mode_disable_loads_nothing(tmp_path):
    found, engine = resume(make(tmp_path), mode="disable")
    assert found is None and engine.loaded == []


def test_resume_mode_resume_path_loads_the_named_checkpoint(tmp_path):
    (folder, got), engine = resume(make(tmp_path), mode="resume_path",
                                   path=str(tmp_path / "global_step_9"))
    assert folder.name == "global_step_9" and got["global_step"] == 9
    assert engine.loaded == ["global_step_9"]


def test_resume_path_that_does_not_exist_names_the_key_and_path(tmp_path):
    with pytest.raises(ConfigError, match=r"resume_from_path=.*global_step_99"):
        resume(make(tmp_path), mode="resume_path", path=str(tmp_path / "global_step_99"))


def test_resume_path_without_committed_is_refused(tmp_path):
    manager = make(tmp_path)
    (tmp_path / "global_step_9" / MARKER).unlink()
    with pytest.raises(CheckpointError, match=r"global_step_9.*COMMITTED"):
        resume(manager, mode="resume_path", path=str(tmp_path / "global_step_9"))


def test_resume_path_of_a_damaged_checkpoint_is_refused_not_replaced(tmp_path):
    manager = make(tmp_path)
    (tmp_path / "global_step_9" / "actor" / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match=r"global_step_9.*optimizer\.pt.*missing"):
        resume(manager, mode="resume_path", path=str(tmp_path / "global_step_9"))


def test_unknown_resume_mode_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="sometimes"):
        resume(make(tmp_path), mode="sometimes")


# ---- falling back from a damaged checkpoint -------------------------------------------

def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, rel, said", [
    (truncate, "actor/weights.bin", r"actor/weights\.bin is truncated"),
    (flip, "actor/weights.bin", r"actor/weights\.bin is corrupted"),
    (Path.unlink, "actor/optimizer.pt", r"actor/optimizer\.pt is missing"),
    (flip, "trainer_state.pt", r"trainer_state\.pt is corrupted"),
    (flip, MANIFEST, r"MANIFEST\.json is corrupted"),
])
def test_damaged_newest_falls_back_to_the_previous_with_one_warning(tmp_path, damage, rel,
                                                                    said):
    manager = make(tmp_path)
    damage(tmp_path / "global_step_10" / rel)
    (folder, got), engine = resume(manager)
    assert folder.name == "global_step_9" and got["global_step"] == 9
    assert engine.loaded == ["global_step_9"]
    text = warnings_of(manager)
    assert text.count("warning:") == 1 and "global_step_10" in text
    assert re.search(said, text), text


def test_no_intact_checkpoint_is_a_clear_error_naming_the_folder(tmp_path):
    manager = make(tmp_path, steps=(2, 9))
    for step in (2, 9):
        truncate(tmp_path / f"global_step_{step}" / "actor" / "weights.bin")
    with pytest.raises(CheckpointError) as info:
        resume(manager)
    message = str(info.value)
    assert str(tmp_path) in message and "global_step_2" in message
    assert "global_step_9" in message and "\n" not in message


def test_checkpoint_without_manifest_loads_unverified_and_quietly(tmp_path):
    manager = make(tmp_path)
    for step in (9, 10):  # as written before manifests existed
        folder = tmp_path / f"global_step_{step}"
        (folder / MANIFEST).unlink()
        (folder / MARKER).write_text(json.dumps({"step": step, "time": 0.0}))
    (folder, _), engine = resume(manager)
    assert folder.name == "global_step_10" and warnings_of(manager) == ""


def test_unverified_checkpoint_missing_a_piece_still_falls_back(tmp_path):
    manager = make(tmp_path)
    folder = tmp_path / "global_step_10"
    (folder / MANIFEST).unlink()
    (folder / MARKER).write_text('{"step": 10}')
    (folder / "actor" / "optimizer.pt").unlink()
    (found, _), engine = resume(manager)
    assert found.name == "global_step_9" and "optimizer.pt" in warnings_of(manager)


def test_empty_committed_folder_is_skipped(tmp_path):
    manager = make(tmp_path, steps=(2,))
    (tmp_path / "global_step_3").mkdir()
    (tmp_path / "global_step_3" / MARKER).write_text('{"step": 3}')
    (found, _), _ = resume(manager)
    assert found.name == "global_step_2" and "global_step_3" in warnings_of(manager)


def test_state_without_dataloader_position_is_refused_when_the_run_has_data(tmp_path):
    manager = CheckpointManager(str(tmp_path), stream=io.StringIO())
    engine = FakeEngine()
    manager.save(1, {"actor": engine}, state(1))
    manager.save(2, {"actor": engine}, state(2, dataloader=False))
    (found, _), _ = resume(manager)
    assert found.name == "global_step_1" and "dataloader" in warnings_of(manager)


# ---- saving: manifest, storage, no .partial left --------------------------------------

def test_save_writes_a_manifest_before_the_marker(tmp_path):
    make(tmp_path, steps=(1,))
    folder = tmp_path / "global_step_1"
    listed = {e["path"]: e for e in json.loads((folder / MANIFEST).read_text())["files"]}
    assert set(listed) == {"actor/weights.bin", "actor/optimizer.pt", "trainer_state.pt"}
    assert listed["actor/weights.bin"]["size"] == 4096 and "sha256" in listed["trainer_state.pt"]
    assert len(json.loads((folder / MARKER).read_text())["manifest_sha256"]) == 64


def test_stale_partial_folders_are_removed_at_start(tmp_path):
    manager = make(tmp_path, steps=(1,))
    (tmp_path / ".global_step_2.partial" / "actor").mkdir(parents=True)
    resume(manager)
    assert not list(tmp_path.glob(".*.partial"))


class FailingEngine(FakeEngine):
    def __init__(self, error):
        super().__init__()
        self.error = error

    def save_checkpoint(self, directory):
        super().save_checkpoint(directory)
        raise self.error


def test_a_save_that_cannot_be_written_warns_and_training_goes_on(tmp_path):
    manager = make(tmp_path, steps=(1,))
    engine = FailingEngine(OSError(28, "No space left on device"))
    assert manager.save(2, {"actor": engine}, state(2), final=False) is None
    assert "step 2 was not saved" in warnings_of(manager)
    assert "No space left" in warnings_of(manager) and "global_step_1" in warnings_of(manager)
    assert manager.committed_steps() == [1] and not list(tmp_path.glob(".*.partial"))


def test_the_last_save_failing_stops_the_run_with_a_storage_error(tmp_path):
    manager = make(tmp_path, steps=(1,))
    engine = FailingEngine(RuntimeError("PytorchStreamWriter failed writing file data/0: "
                                        "file write failed"))
    with pytest.raises(StorageError, match=r"step 2 was not saved.*global_step_1"):
        manager.save(2, {"actor": engine}, state(2), final=True)
    assert manager.committed_steps() == [1] and not list(tmp_path.glob(".*.partial"))


def test_a_bug_in_a_save_is_raised_and_leaves_no_partial(tmp_path):
    manager = make(tmp_path, steps=(1,))
    with pytest.raises(KeyError):
        manager.save(2, {"actor": FailingEngine(KeyError("bug"))}, state(2), final=False)
    assert not list(tmp_path.glob(".*.partial"))


Usage = namedtuple("Usage", "total used free")


def test_not_enough_free_space_skips_the_save_before_writing(tmp_path, monkeypatch):
    manager = make(tmp_path, steps=(1,))
    size = sum(p.stat().st_size for p in (tmp_path / "global_step_1").rglob("*"))
    monkeypatch.setattr(checkpoint_storage.shutil, "disk_usage",
                        lambda _: Usage(10 << 30, 10 << 30, size))
    engine = FakeEngine()
    assert manager.save(2, {"actor": engine}, state(2), final=False) is None
    assert "free" in warnings_of(manager) and manager.committed_steps() == [1]
    with pytest.raises(StorageError, match="free"):
        manager.save(2, {"actor": engine}, state(2), final=True)
    assert not list(tmp_path.glob(".*.partial"))


def test_output_folder_that_is_a_file_is_a_storage_error(tmp_path):
    (tmp_path / "run").write_text("a file")
    with pytest.raises(StorageError, match=r"run is a file, not a folder"):
        checkpoint_storage.check_output_dir(tmp_path / "run")
    with pytest.raises(StorageError, match=r"run/sub.*cannot be written.*Not a directory"):
        checkpoint_storage.check_output_dir(tmp_path / "run" / "sub")


def test_estimate_before_the_first_save_counts_weights_export_and_moments():
    module = torch.nn.Linear(10, 10)  # 110 float32 parameters

    class Actor:
        def __init__(self):
            self.module, self.optimizer = module, object()

        def export_hf(self, directory):
            pass

    assert checkpoint_storage.engine_bytes({"actor": Actor()}) == 110 * 4 * 2 + 110 * 8
