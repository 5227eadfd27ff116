"""The megatron engine refuses a checkpoint without a piece the run needs, before any
weights load (a missing optimizer used to resume silently with a fresh one)."""

import pytest

pytest.importorskip("megatron.core")

from siirl.dag_worker.checkpoint.errors import DamagedCheckpointError  # noqa: E402
from siirl.engine.megatron import checkpointing  # noqa: E402

ALL = ("model", "optimizer", "extra")


def folder(tmp_path, *names):
    (tmp_path / checkpointing.DIST_CKPT).mkdir()
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    return str(tmp_path)


def test_every_piece_there_passes(tmp_path):
    checkpointing.check_pieces(folder(tmp_path, "extra.pt", "optimizer.tp1.pt"), ALL,
                                optimizer=object())


def test_missing_optimizer_state_is_refused(tmp_path):
    with pytest.raises(DamagedCheckpointError, match="no optimizer state"):
        checkpointing.check_pieces(folder(tmp_path, "extra.pt"), ALL, optimizer=object())
    # a run without an optimizer (or that loads weights only) does not need it
    checkpointing.check_pieces(str(tmp_path), ("model", "extra"), optimizer=object())


def test_missing_extra_and_weights_are_refused(tmp_path):
    with pytest.raises(DamagedCheckpointError, match="extra.pt"):
        checkpointing.check_pieces(folder(tmp_path, "optimizer.pt"), ALL, optimizer=object())
    with pytest.raises(DamagedCheckpointError, match="dist_ckpt"):
        checkpointing.check_pieces(str(tmp_path / "absent"), ("model",), optimizer=None)
