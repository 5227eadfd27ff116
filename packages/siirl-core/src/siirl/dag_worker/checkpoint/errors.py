"""Errors of checkpoints and of the storage they are written to.

Each message is one paragraph that names the folder or file and the cause; the CLI prints
a ``SiirlError`` without a traceback. The engines raise these too (siirl-engine imports
siirl-core), so a missing optimizer file reads the same on every backend.
"""

from __future__ import annotations

from siirl.errors import DataError, SiirlError


class CheckpointError(DataError):
    """A checkpoint that cannot be resumed by this run (another model, a refused folder).

    A ``DataError`` (exit status 2), as the engines' checkpoint errors always were."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint that is damaged or incomplete: a file missing, truncated or corrupted,
    or a piece the run needs (optimizer, trainer state) absent. Raised before anything is
    loaded from it, so ``trainer.resume_mode=auto`` can fall back to an older one."""


class StorageError(SiirlError):
    """The output folder cannot hold what the run must write (read-only, full, a file)."""

    exit_code = 1
