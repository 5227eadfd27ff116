"""Checkpoint behaviour that mutation testing (``nox -s mutmut -- checkpoint``) found no
test for: the manifest's crc32 path and its damage reports, the storage checks (room,
sizes, what an error says), the trainer-state file and the manager's bookkeeping.

Each test states a behaviour; docs/mutation.md lists the mutants they kill and the ones
that change nothing observable.
"""

import hashlib
import io
import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from siirl.dag_worker.checkpoint import manifest, storage
from siirl.dag_worker.checkpoint.errors import CheckpointError, DamagedCheckpointError
from siirl.dag_worker.checkpoint.manager import LATEST, MARKER, CheckpointManager
from siirl.dag_worker.checkpoint.state import load_state, rng_state, save_state, state_file
from siirl.dag_worker.walk.collective import WorkerComm


class Engine:
    def __init__(self, step=1, size=4096):
        self.step, self.size, self.loaded, self.exported = step, size, [], []

    def save_checkpoint(self, directory):
        Path(directory).mkdir(parents=True)
        Path(directory, "weights.bin").write_bytes(bytes([self.step % 256]) * self.size)

    def load_checkpoint(self, directory):
        self.loaded.append(Path(directory).parent.name)


class ExportingEngine(Engine):
    def export_hf(self, directory):
        Path(directory).mkdir(parents=True)
        Path(directory, "config.json").write_text("{}")
        self.exported.append(directory)


def state(step, dataloader=True):
    return {"global_step": step, "rng": {"seed": 1},
            "dataloader": {"epoch": 0} if dataloader else None}


def manager_with(tmp_path, steps, keep=None, engine=None):
    manager = CheckpointManager(str(tmp_path), keep, stream=io.StringIO())
    for step in steps:
        manager.save(step, {"actor": engine or Engine(step)}, state(step))
    return manager


# ---- the manifest ------------------------------------------------------------------------

def test_checksums_are_sha256_and_crc32_of_the_whole_file_in_chunks(tmp_path, monkeypatch):
    data = os.urandom(10_000)
    path = tmp_path / "blob"
    path.write_bytes(data)
    monkeypatch.setattr(manifest, "_CHUNK", 1000)  # ten chunks: the crc must be chained
    assert manifest.file_checksum(path, "sha256") == hashlib.sha256(data).hexdigest()
    assert manifest.file_checksum(path, "crc32") == f"{zlib.crc32(data):08x}"


def test_files_above_the_threshold_get_a_crc32_and_its_damage_is_found(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    (folder / "actor").mkdir(parents=True)
    (folder / "actor" / "big.bin").write_bytes(b"a" * 100)
    (folder / "small.bin").write_bytes(b"b" * 10)
    monkeypatch.setattr(manifest, "CRC_ABOVE", 10)  # 10 bytes: still sha256; 100: crc32
    manifest.write_manifest(folder)
    entries = {e["path"]: e for e in json.loads((folder / manifest.MANIFEST).read_text())
               ["files"]}
    assert set(entries["actor/big.bin"]) == {"path", "size", "crc32"}
    assert set(entries["small.bin"]) == {"path", "size", "sha256"}
    assert manifest.verify_manifest(folder) == []
    (folder / "actor" / "big.bin").write_bytes(b"c" * 100)
    assert manifest.verify_manifest(folder) == [
        "actor/big.bin is corrupted (its crc32 differs from the one written)"]


def test_a_file_that_grew_is_reported_as_changed_not_truncated(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "w.bin").write_bytes(b"x" * 10)
    manifest.write_manifest(folder)
    (folder / "w.bin").write_bytes(b"x" * 12)
    assert manifest.verify_manifest(folder) == ["w.bin is changed (12 bytes, 10 written)"]
    (folder / "w.bin").write_bytes(b"x" * 9)
    assert manifest.verify_manifest(folder) == ["w.bin is truncated (9 bytes, 10 written)"]


@pytest.mark.parametrize("entry", [
    {"path": "w.bin", "size": 1},                       # no checksum
    {"path": "w.bin", "sha256": "00"},                  # no size
    {"size": 1, "sha256": "00"},                        # no path
    "w.bin",                                            # not an entry at all
])
def test_a_manifest_entry_missing_a_field_makes_the_manifest_unreadable(tmp_path, entry):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / manifest.MANIFEST).write_text(json.dumps({"version": 1, "files": [entry]}))
    assert manifest.verify_manifest(folder) == [f"{manifest.MANIFEST} is unreadable"]


def test_a_manifest_whose_files_are_not_a_list_is_unreadable(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / manifest.MANIFEST).write_text(json.dumps({"files": {"path": "w.bin"}}))
    assert manifest.verify_manifest(folder) == [f"{manifest.MANIFEST} is unreadable"]


def test_without_a_manifest_a_folder_is_unverified_unless_one_was_recorded(tmp_path):
    assert manifest.verify_manifest(tmp_path) is None
    assert manifest.verify_manifest(tmp_path, "ab" * 32) == [f"{manifest.MANIFEST} is missing"]


def test_manifest_bytes_is_the_total_listed_size(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "a").write_bytes(b"1" * 300)
    (folder / "b").write_bytes(b"2" * 45)
    manifest.write_manifest(folder)
    assert manifest.manifest_bytes(folder) == 345
    assert manifest.manifest_bytes(tmp_path / "nothing") is None
    (folder / manifest.MANIFEST).write_text("{not json")
    assert manifest.manifest_bytes(folder) is None


# ---- storage ------------------------------------------------------------------------------

@pytest.mark.parametrize("size, text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KB"), (1536, "1.5 KB"),
    (5 * 1024 ** 2, "5.0 MB"), (3 * 1024 ** 3, "3.0 GB"), (2 * 1024 ** 4, "2.0 TB"),
    (2048 * 1024 ** 4, "2048.0 TB"),
])
def test_human_sizes(size, text):
    assert storage.human(size) == text


def test_a_save_needs_the_estimate_plus_ten_percent_and_32_mb():
    assert storage.needed(0) == 32 << 20
    assert storage.needed(1000) == 1100 + (32 << 20)


def test_prepare_goes_ahead_with_exactly_enough_room_and_refuses_one_byte_less(tmp_path,
                                                                             monkeypatch):
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    root, partial = tmp_path / "a" / "b", tmp_path / "a" / "b" / ".global_step_1.partial"
    free = storage.needed(1000)
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda _: usage(0, 0, free))
    assert storage.prepare(root, partial, 1000) is None  # nested root: created
    assert partial.is_dir()
    (partial / "leftover").write_text("old")  # a previous attempt's file: started afresh
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda _: usage(0, 0, free - 1))
    problem = storage.prepare(root, partial, 1000)
    assert problem is not None and "free" in problem and not partial.exists()
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda _: usage(0, 0, free))
    assert storage.prepare(root, partial, 1000) is None and list(partial.iterdir()) == []


def test_prepare_names_the_os_error_when_the_folder_cannot_be_made(tmp_path):
    (tmp_path / "file").write_text("x")
    problem = storage.prepare(tmp_path / "file" / "run", tmp_path / "file" / "run" / ".p", 0)
    assert "cannot be written" in problem and "Not a directory" in problem


def test_describe_keeps_the_os_words_and_the_file():
    assert storage.describe(OSError(28, "No space left on device", "/ckpt/w.bin")) == \
        "No space left on device: /ckpt/w.bin"
    assert storage.describe(OSError(28, "No space left on device")) == \
        "No space left on device"


def test_describe_of_other_errors_is_their_last_line_or_their_type():
    assert storage.describe(RuntimeError("first\nsecond\nlast line")) == "last line"
    assert storage.describe(RuntimeError("")) == "RuntimeError"
    assert storage.describe(RuntimeError("x" * 500)) == "x" * 300
    full = storage.describe(RuntimeError("[enforce fail at inline_container.cc] "
                                         ". unexpected pos 123 vs 456"))
    assert "could not be written in full" in full
    assert "could not be written in full" in storage.describe(RuntimeError("Write Failed"))
    assert storage.describe(RuntimeError("something else")) == "something else"


def test_storage_errors_are_recognised_by_type_or_by_the_writers_words():
    assert storage.is_storage_error(OSError("x"))
    assert storage.is_storage_error(RuntimeError("PytorchStreamWriter: file write failed"))
    assert storage.is_storage_error(RuntimeError("No space left"))
    assert not storage.is_storage_error(RuntimeError("shape mismatch"))
    assert not storage.is_storage_error(KeyboardInterrupt("no space"))


def test_clean_stale_removes_only_partial_folders_and_names_them_sorted(tmp_path):
    for name in (".global_step_9.partial", ".global_step_10.partial", "global_step_3"):
        (tmp_path / name / "actor").mkdir(parents=True)
    (tmp_path / ".global_step_4.partial.txt").write_text("not a folder of ours")
    assert storage.clean_stale(tmp_path) == [".global_step_10.partial",
                                             ".global_step_9.partial"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".global_step_4.partial.txt",
                                                          "global_step_3"]
    assert storage.clean_stale(tmp_path / "missing") == []


def test_check_output_dir_creates_nested_folders_and_leaves_no_probe(tmp_path):
    root = tmp_path / "a" / "b"
    storage.check_output_dir(root)
    storage.check_output_dir(root)  # an existing folder is fine too
    assert root.is_dir() and list(root.iterdir()) == []


# ---- the trainer state --------------------------------------------------------------------

def test_numpy_rng_keys_are_stored_as_int64_so_weights_only_loads_them():
    name, keys, pos, has_gauss, gauss = rng_state()["numpy"]
    assert keys.dtype == torch.int64 and keys.shape == (624,)
    assert (keys.numpy() == np.random.get_state()[1].astype(np.int64)).all()


def test_a_worker_without_its_own_file_reads_rank_zeros(tmp_path):
    save_state(tmp_path / state_file(0), {"global_step": 3, "rng": {}, "who": 0})
    save_state(tmp_path / state_file(2), {"global_step": 3, "rng": {}, "who": 2})
    assert load_state(tmp_path, 2, False)["who"] == 2
    assert load_state(tmp_path, 1, False)["who"] == 0


@pytest.mark.parametrize("content", [{"global_step": 1}, {"rng": {}}, [1, 2]])
def test_a_state_lacking_a_required_key_is_damage(tmp_path, content):
    torch.save(content, tmp_path / state_file(0))
    with pytest.raises(DamagedCheckpointError, match="lacks"):
        load_state(tmp_path, 0, False)


def test_an_unreadable_state_file_names_the_first_line_or_the_error_type(tmp_path):
    (tmp_path / state_file(0)).write_bytes(b"not a torch file")
    with pytest.raises(DamagedCheckpointError, match=r"trainer_state\.pt cannot be read"):
        load_state(tmp_path, 0, False)


# ---- the manager's bookkeeping -------------------------------------------------------------

def test_the_commit_records_its_step_and_the_latest_file(tmp_path):
    manager_with(tmp_path, (3, 12))
    marker = json.loads((tmp_path / "global_step_12" / MARKER).read_text())
    assert marker["step"] == 12 and marker["time"] > 0
    assert (tmp_path / LATEST).read_text() == "12"


def test_a_role_with_a_hugging_face_export_writes_it_inside_the_checkpoint(tmp_path):
    engine = ExportingEngine(1)
    manager = manager_with(tmp_path, (1,), engine=engine)
    assert (tmp_path / "global_step_1" / "actor" / "huggingface" / "config.json").is_file()
    assert manager.problems(tmp_path / "global_step_1") is None


def test_saving_a_step_again_replaces_its_checkpoint(tmp_path):
    manager = manager_with(tmp_path, (5,))
    manager.save(5, {"actor": Engine(77)}, state(5))
    assert (tmp_path / "global_step_5" / "actor" / "weights.bin").read_bytes()[:1] == b"M"
    assert manager.committed_steps() == [5]


def test_the_next_saves_room_is_estimated_from_the_previous_checkpoint(tmp_path, monkeypatch):
    """After a save of N bytes the next one needs needed(N) free: one byte less skips it."""
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    manager = manager_with(tmp_path, (1,), engine=Engine(1, size=1 << 20))
    size = manifest.manifest_bytes(tmp_path / "global_step_1")
    assert size > 1 << 20
    monkeypatch.setattr(storage.shutil, "disk_usage",
                        lambda _: usage(0, 0, storage.needed(size) - 1))
    assert manager.save(2, {"actor": Engine(2)}, state(2), final=False) is None
    assert "checkpoint of step 2 was not saved" in manager.stream.getvalue()
    # a fresh manager (a resumed run) reads the size from the newest checkpoint's manifest
    fresh = CheckpointManager(str(tmp_path), stream=io.StringIO())
    assert fresh.save(2, {"actor": Engine(2)}, state(2), final=False) is None
    monkeypatch.setattr(storage.shutil, "disk_usage",
                        lambda _: usage(0, 0, storage.needed(size)))
    assert fresh.save(2, {"actor": Engine(2)}, state(2), final=False) == \
        tmp_path / "global_step_2"


def test_a_repeated_failure_is_warned_about_briefly_and_a_new_cause_in_full(tmp_path):
    class Full(Engine):
        def save_checkpoint(self, directory):
            raise OSError(28, "No space left on device")

    class ReadOnly(Engine):
        def save_checkpoint(self, directory):
            raise OSError(30, "Read-only file system")

    manager = CheckpointManager(str(tmp_path), stream=io.StringIO())
    for step in (1, 2):
        assert manager.save(step, {"actor": Full()}, state(step), final=False) is None
    manager.save(3, {"actor": ReadOnly()}, state(3), final=False)
    lines = manager.stream.getvalue().splitlines()
    assert len(lines) == 3
    assert "No space left" in lines[0]
    assert lines[0].endswith("; no checkpoint of this run is committed.")
    assert "either (same cause)" in lines[1] and "No space" not in lines[1]
    assert "Read-only file system" in lines[2]
    # a success in between: the same cause is news again
    manager.save(4, {"actor": Engine(4)}, state(4), final=False)
    manager.save(5, {"actor": ReadOnly()}, state(5), final=False)
    assert "Read-only file system" in manager.stream.getvalue().splitlines()[-1]


def test_a_damaged_checkpoint_lists_four_problems_and_counts_the_rest(tmp_path):
    manager = CheckpointManager(str(tmp_path), stream=io.StringIO())

    class Six(Engine):
        def save_checkpoint(self, directory):
            Path(directory).mkdir(parents=True)
            for i in range(6):
                Path(directory, f"f{i}.bin").write_bytes(b"x")

    manager.save(1, {"actor": Six()}, state(1))
    folder = tmp_path / "global_step_1"
    for i in range(5):
        (folder / "actor" / f"f{i}.bin").unlink()
    problem = manager.problems(folder)
    assert problem == "; ".join(f"actor/f{i}.bin is missing" for i in range(4)) + " and 1 more"
    (folder / "actor" / "f0.bin").write_bytes(b"x")
    assert manager.problems(folder) == "; ".join(f"actor/f{i}.bin is missing"
                                                 for i in range(1, 5))


def test_the_warning_for_a_damaged_checkpoint_says_whether_an_older_one_is_left(tmp_path):
    manager = manager_with(tmp_path, (1, 2))
    for step in (1, 2):
        (tmp_path / f"global_step_{step}" / "actor" / "weights.bin").unlink()
    with pytest.raises(CheckpointError):
        manager.restore({"actor": Engine()})
    first, second = manager.stream.getvalue().splitlines()
    assert "global_step_2" in first and first.endswith(". Trying the next older committed "
                                                       "checkpoint.")
    assert "global_step_1" in second and second.endswith(". No older committed checkpoint "
                                                         "is left.")


def test_resume_path_refuses_a_checkpoint_without_the_dataloader_position(tmp_path):
    manager = CheckpointManager(str(tmp_path), stream=io.StringIO())
    manager.save(1, {"actor": Engine()}, state(1, dataloader=False))
    with pytest.raises(CheckpointError, match="dataloader"):
        manager.restore({"actor": Engine()}, mode="resume_path",
                        path=str(tmp_path / "global_step_1"), needs_dataloader=True)
    with pytest.raises(CheckpointError, match="dataloader"):
        manager.load(tmp_path / "global_step_1", {"actor": Engine()}, needs_dataloader=True)
    assert manager.load(tmp_path / "global_step_1", {"actor": Engine()})["global_step"] == 1


def test_a_checkpoint_missing_two_roles_names_both_and_the_first_folder(tmp_path):
    manager = manager_with(tmp_path, (1,))
    with pytest.raises(CheckpointError, match=r"critic, ref \(critic/ is missing\)"):
        manager.load(tmp_path / "global_step_1",
                     {"actor": Engine(), "critic": Engine(), "ref": Engine()})


def test_a_worker_that_is_not_rank_zero_reads_its_own_state(tmp_path):
    class Rank1(WorkerComm):
        def __init__(self):
            super().__init__(rank=1)

        def broadcast(self, obj):  # a one-process stand-in for rank 0's answer
            return obj

        def all_gather(self, obj):
            return [obj]

    manager = manager_with(tmp_path, (1,))
    save_state(tmp_path / "global_step_1" / state_file(1),
               {"global_step": 1, "rng": {}, "who": 1, "dataloader": {}})
    assert manager.load(tmp_path / "global_step_1", {"actor": Engine()}, Rank1())["who"] == 1


def test_the_estimate_is_this_runs_previous_save_not_a_newer_checkpoint(tmp_path, monkeypatch):
    """A run resumed from step 10 while a bigger step 30 exists: after saving 11, the room
    needed for 12 follows 11's size."""
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    manager_with(tmp_path, (30,), engine=Engine(30, size=8 << 20))
    manager = CheckpointManager(str(tmp_path), stream=io.StringIO())
    manager.save(11, {"actor": Engine(11, size=1 << 10)}, state(11))
    small = manifest.manifest_bytes(tmp_path / "global_step_11")
    monkeypatch.setattr(storage.shutil, "disk_usage",
                        lambda _: usage(0, 0, storage.needed(small)))
    assert manager.save(12, {"actor": Engine(12, size=1 << 10)}, state(12), final=False) == \
        tmp_path / "global_step_12"


def test_a_commit_that_fails_on_storage_warns_with_the_os_words(tmp_path, monkeypatch):
    import siirl.dag_worker.checkpoint.manager as module

    def full(folder):
        raise OSError(28, "No space left on device", str(folder))

    manager = CheckpointManager(str(tmp_path), stream=io.StringIO())
    monkeypatch.setattr(module, "write_manifest", full)
    assert manager.save(1, {"actor": Engine()}, state(1), final=False) is None
    assert "No space left on device" in manager.stream.getvalue()
    assert not list(tmp_path.glob(".*.partial")) and manager.committed_steps() == []


def test_by_default_a_save_is_the_last_and_its_failure_stops_the_run(tmp_path):
    from siirl.dag_worker.checkpoint.errors import StorageError

    class Full(Engine):
        def save_checkpoint(self, directory):
            raise OSError(28, "No space left on device")

    with pytest.raises(StorageError):
        CheckpointManager(str(tmp_path), stream=io.StringIO()).save(1, {"actor": Full()},
                                                                    state(1))


def test_resume_does_not_need_the_dataloader_position_unless_asked(tmp_path):
    manager = CheckpointManager(str(tmp_path), stream=io.StringIO())
    manager.save(1, {"actor": Engine()}, state(1, dataloader=False))
    (folder, got) = manager.restore({"actor": Engine()})
    assert folder.name == "global_step_1" and got["global_step"] == 1


def test_a_marker_that_is_not_json_leaves_the_checkpoint_unverified_not_damaged(tmp_path):
    manager = manager_with(tmp_path, (1,))
    (tmp_path / "global_step_1" / MARKER).write_text("committed by hand")
    assert manager.problems(tmp_path / "global_step_1") is None


class Rank1(WorkerComm):
    """Rank 1 of two, in one process: the collectives hand back this rank's own values
    (what rank 0 would answer here, since both see the same folders)."""

    def __init__(self):
        super().__init__(rank=1)

    def broadcast(self, obj):
        return obj

    def all_gather(self, obj):
        return [obj]


def test_a_worker_that_is_not_rank_zero_writes_only_its_own_state(tmp_path):
    manager = CheckpointManager(str(tmp_path), stream=io.StringIO())
    manager.save(1, {"actor": Engine()}, state(1), Rank1())
    partial = tmp_path / ".global_step_1.partial"
    assert (partial / state_file(1)).is_file() and not (partial / state_file(0)).exists()
    assert manager.committed_steps() == []  # rank 0 commits

    class FullHalfway(Engine):
        def save_checkpoint(self, directory):
            Path(directory).mkdir(parents=True)
            raise OSError(28, "No space left on device")

    manager.save(2, {"actor": FullHalfway()}, state(2), Rank1(), final=False)
    assert (tmp_path / ".global_step_2.partial").is_dir()  # rank 0's to remove


class Rank1AsRankZero(Rank1):
    """Rank 1 doing rank 0's reading too (a one-process stand-in for the broadcast)."""

    @property
    def is_chief(self):
        return True


def test_a_worker_that_is_not_rank_zero_resumes_its_own_state(tmp_path):
    manager = manager_with(tmp_path, (1,))
    save_state(tmp_path / "global_step_1" / state_file(1),
               {"global_step": 1, "rng": {}, "who": 1, "dataloader": {}})
    folder, got = manager.restore({"actor": Engine()}, Rank1AsRankZero())
    assert got["who"] == 1
    folder, got = manager.restore({"actor": Engine()}, Rank1(), mode="resume_path",
                                  path=str(tmp_path / "global_step_1"))
    assert got["who"] == 1


def test_nested_values_of_a_trainer_state_are_checked_by_their_path(tmp_path):
    with pytest.raises(TypeError, match=r"trainer state state\.algo\[1\] is a object"):
        save_state(tmp_path / "s.pt", {"algo": [1, object()]})
    with pytest.raises(TypeError, match=r"trainer state state is a object"):
        save_state(tmp_path / "s.pt", {object(): 1})
    save_state(tmp_path / "s.pt", {"a": {"b": [1, 2.0, "x", None, torch.ones(1)]}})


def test_an_unreadable_state_names_the_first_line_of_the_error_or_its_type(tmp_path,
                                                                           monkeypatch):
    import siirl.dag_worker.checkpoint.state as module

    save_state(tmp_path / state_file(0), {"global_step": 1, "rng": {}})
    errors = iter([RuntimeError("first line\nsecond line"), RuntimeError("")])

    def broken(*args, **kwargs):
        raise next(errors)

    monkeypatch.setattr(module.torch, "load", broken)
    with pytest.raises(DamagedCheckpointError, match=r"\(first line\)$"):
        load_state(tmp_path, 0, False)
    with pytest.raises(DamagedCheckpointError, match=r"\(RuntimeError\)$"):
        load_state(tmp_path, 0, False)


def test_engine_bytes_over_several_engines_and_their_shapes():
    class Backend:
        def __init__(self):
            self.module = torch.nn.Linear(2, 2)  # 6 parameters

    class Wrapped:  # the module behind a backend, no optimizer
        backend = Backend()

    class Bare:  # nothing to measure
        module = object()

    class Exporting:
        def __init__(self):
            self.module, self.optimizer = torch.nn.Linear(1, 1), object()  # 2 parameters

        def export_hf(self, directory):
            pass

    assert storage.engine_bytes({"a": Bare(), "b": Wrapped()}) == 6 * 4
    assert storage.engine_bytes({"a": Wrapped(), "b": Exporting()}) == \
        6 * 4 + (2 * 4 * 2 + 2 * 8)


def test_folder_bytes_counts_every_file_below(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "x").write_bytes(b"1" * 5)
    (tmp_path / "a" / "b" / "y").write_bytes(b"2" * 7)
    assert storage.folder_bytes(tmp_path) == 12
