"""Checkpoints under ``trainer.default_local_dir/global_step_N/``.

Layout of one checkpoint::

    global_step_N/
      actor/                 engine state (model, optimizer, scheduler), per stateful role
      actor/huggingface/     save_pretrained export, loadable by transformers alone
      trainer_state.pt       step, dataloader position, RNG states, algorithm state
      trainer_state.rankR.pt the same for worker R > 0 (its own RNG states)
      MANIFEST.json          every file above with its size and checksum
      COMMITTED              written last, by rank 0, once every worker has finished

A checkpoint is written into ``.global_step_N.partial`` and renamed when complete, and only
directories holding ``COMMITTED`` are ever resumed from, so a crash mid-save never leaves
a checkpoint that looks complete; a ``.partial`` folder is removed when its save fails and
at the next start. ``latest_checkpointed_iteration.txt`` (verl's name) records the newest.

Resuming (``trainer.resume_mode=auto``) takes the newest committed checkpoint whose files
match its manifest and that holds every piece the run needs; a damaged one is named in a
warning and the next older one is tried. Checkpoints without a manifest (written before
manifests existed) are accepted unverified. ``resume_path`` refuses a damaged checkpoint.

A save first checks that the folder is writable and has room (``checkpoint_storage``).
When it cannot be written, a run with later saves to come warns and trains on; the run's
last save stops it with a ``StorageError`` instead, since its steps would be lost.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from siirl.dag_worker.checkpoint import storage
from siirl.dag_worker.checkpoint.errors import (
    CheckpointError,
    DamagedCheckpointError,
    StorageError,
)
from siirl.dag_worker.checkpoint.manifest import manifest_bytes, verify_manifest, write_manifest
from siirl.dag_worker.checkpoint.state import (  # noqa: F401  (re-exported)
    load_state,
    rng_state,
    save_state,
    set_rng_state,
    state_file,
)
from siirl.dag_worker.walk.collective import WorkerComm
from siirl.dag_worker.walk.console import write_line
from siirl.errors import ConfigError

PREFIX = "global_step_"
MARKER = "COMMITTED"
LATEST = "latest_checkpointed_iteration.txt"
STATEFUL_ROLES = ("actor", "critic")
RESUME_MODES = ("auto", "disable", "resume_path")


class CheckpointManager:
    def __init__(self, root: str, max_to_keep: Optional[int] = None, stream: Any = None):
        self.root = Path(root)
        self.max_to_keep = max_to_keep
        self.stream = stream  # where warnings go (stderr)
        self._last_bytes: Optional[int] = None  # size of this run's previous save
        self._unsaved_reason: Optional[str] = None

    def _say(self, line: str) -> None:
        write_line(line, self.stream or sys.stderr)

    # ---- which checkpoints there are ---------------------------------------------------

    def path_of(self, step: int) -> Path:
        return self.root / f"{PREFIX}{step}"

    def committed_steps(self) -> List[int]:
        """Steps of the folders holding ``COMMITTED``, oldest first (by number)."""
        if not self.root.is_dir():
            return []
        steps = []
        for entry in self.root.iterdir():
            match = re.fullmatch(rf"{PREFIX}(\d+)", entry.name)
            if match and (entry / MARKER).is_file():
                steps.append(int(match.group(1)))
        return sorted(steps)

    def latest(self) -> Optional[Path]:
        steps = self.committed_steps()
        return self.path_of(steps[-1]) if steps else None

    # ---- saving ----------------------------------------------------------------------

    def save(self, step: int, engines: Dict[str, Any], trainer_state: Dict[str, Any],
             comm: Any = None, *, final: bool = True) -> Optional[Path]:
        """Write checkpoint ``step``; with several workers every one calls this (``comm``
        their ``WorkerComm``): each writes its own state, rank 0 commits after all did.

        ``final``: no later save is due in this run, so one that cannot be written stops
        the run (``StorageError``); otherwise it is skipped with a warning (returns None).
        """
        comm = comm if comm is not None else WorkerComm()
        partial = self.root / f".{PREFIX}{step}.partial"
        problem = None
        if comm.is_chief:
            problem = storage.prepare(self.root, partial, self._estimate(engines))
        problem = comm.broadcast(problem)  # also: the folder exists before anyone writes
        if problem:
            return self._not_saved(step, problem, final, comm)
        try:
            problem = self._write(partial, engines, trainer_state, comm.rank)
            problems = [p for p in comm.all_gather(problem) if p]  # every worker is done
            problem = problems[0] if problems else None
            if comm.is_chief and problem is None:
                problem = self._commit(step, partial)
        except BaseException:  # a bug, Ctrl-C, SIGTERM: no half-written folder stays
            if comm.is_chief:
                shutil.rmtree(partial, ignore_errors=True)
            raise
        if comm.is_chief and problem is not None:
            shutil.rmtree(partial, ignore_errors=True)
        problem = comm.broadcast(problem)
        if problem:
            return self._not_saved(step, problem, final, comm)
        self._unsaved_reason = None
        return self.path_of(step)

    def _estimate(self, engines: Dict[str, Any]) -> int:
        if self._last_bytes is None:
            latest = self.latest()
            self._last_bytes = manifest_bytes(latest) if latest is not None else None
        return self._last_bytes or storage.engine_bytes(engines)

    def _write(self, partial: Path, engines: Dict[str, Any], trainer_state: Dict[str, Any],
               rank: int) -> Optional[str]:
        """This worker's files; why they could not be written (storage), or None."""
        try:
            for role, engine in engines.items():
                engine.save_checkpoint(str(partial / role))  # collective when sharded
                if hasattr(engine, "export_hf"):
                    engine.export_hf(str(partial / role / "huggingface"))
            save_state(partial / state_file(rank), trainer_state)
        except Exception as exc:
            if not storage.is_storage_error(exc):
                raise
            return storage.describe(exc)
        return None

    def _commit(self, step: int, partial: Path) -> Optional[str]:
        """Manifest, marker, rename into place; why it failed (storage), or None."""
        final = self.path_of(step)
        try:
            digest = write_manifest(partial)
            (partial / MARKER).write_text(json.dumps({"step": step, "time": time.time(),
                                                      "manifest_sha256": digest}))
            if final.exists():
                shutil.rmtree(final)
            os.replace(partial, final)
        except OSError as exc:
            return storage.describe(exc)
        self._last_bytes = manifest_bytes(final)
        try:
            tmp_latest = self.root / f".{LATEST}.tmp"
            tmp_latest.write_text(str(step))
            os.replace(tmp_latest, self.root / LATEST)
        except OSError:
            pass  # a hint for other tools only: resuming lists the folders
        self._prune(step)
        return None

    def _not_saved(self, step: int, reason: str, final: bool, comm: Any) -> None:
        latest = self.latest()
        kept = f"the last committed checkpoint is {latest}" if latest else \
            "no checkpoint of this run is committed"
        text = f"checkpoint of step {step} was not saved: {reason}"
        if final:
            raise StorageError(f"{text}. It was the run's last checkpoint, so the run stops; "
                               f"{kept}. Free some space or make {self.root} writable (or "
                               "set trainer.default_local_dir to another folder) and run "
                               f"again{' to resume from it' if latest else ''}.")
        if comm.is_chief:
            if reason != self._unsaved_reason:
                self._say(f"warning: {text}. Training goes on and tries again at the next "
                          f"trainer.save_freq step; {kept}.")
            else:
                self._say(f"warning: checkpoint of step {step} was not saved either (same "
                          "cause); training goes on.")
        self._unsaved_reason = reason
        return None

    def _prune(self, step: int) -> None:
        """Keep the newest ``max_to_keep`` checkpoints up to ``step`` (the one just
        committed); newer ones, left by a run that resumed from an earlier step, are
        not this run's to delete."""
        if not self.max_to_keep or self.max_to_keep <= 0:
            return
        older = [s for s in self.committed_steps() if s <= step]
        for old in older[:-self.max_to_keep]:
            shutil.rmtree(self.path_of(old), ignore_errors=True)

    # ---- resuming --------------------------------------------------------------------

    def restore(self, engines: Dict[str, Any], comm: Any = None, *, mode: str = "auto",
                path: Any = None, needs_dataloader: bool = False
                ) -> Optional[Tuple[Path, Dict[str, Any]]]:
        """Load the checkpoint ``mode`` picks into ``engines``; ``(folder, this worker's
        trainer state)``, or None when there is none to resume from."""
        comm = comm if comm is not None else WorkerComm()
        if comm.is_chief:
            storage.clean_stale(self.root)
        if mode not in RESUME_MODES:
            raise ConfigError(f"trainer.resume_mode={mode!r} is not one of "
                              f"{', '.join(RESUME_MODES)}")
        if mode == "disable":
            return None
        if mode == "resume_path":
            # rank 0 reads the manifest once; every worker raises the same refusal
            refusal = comm.broadcast(self._refusal(path) if comm.is_chief else None)
            if refusal is not None:
                kind, message = refusal
                raise (ConfigError if kind == "config" else CheckpointError)(message)
            folder = Path(str(path))
            return folder, self.load(folder, engines, comm, needs_dataloader)
        steps = comm.broadcast(self.committed_steps() if comm.is_chief else None)
        damaged = []
        for left, step in reversed(list(enumerate(steps))):  # newest first
            folder = self.path_of(step)
            problem = comm.broadcast(self.problems(folder) if comm.is_chief else None)
            if problem is None:
                try:
                    return folder, self._load(folder, engines, comm, needs_dataloader)
                except DamagedCheckpointError as exc:
                    problem = str(exc)
            damaged.append(f"{folder.name} ({problem})")
            if comm.is_chief:
                then = "Trying the next older committed checkpoint." if left else \
                    "No older committed checkpoint is left."
                self._say(f"warning: checkpoint {folder} is damaged and was skipped: "
                          f"{problem}. {then}")
        if damaged:
            raise CheckpointError(
                f"no intact checkpoint to resume from in {self.root}: "
                f"{'; '.join(damaged)}. Move the damaged folders away, or set "
                "trainer.resume_mode=disable to start over.")
        return None

    def problems(self, folder: Path) -> Optional[str]:
        """What the manifest says is wrong with ``folder`` (None: nothing, or no manifest)."""
        expected = None
        try:
            expected = json.loads((folder / MARKER).read_text()).get("manifest_sha256")
        except (OSError, ValueError, AttributeError):
            pass  # a marker from before manifests (or a hand-written one): unverified
        found = verify_manifest(folder, expected)
        if not found:
            return None
        more = f" and {len(found) - 4} more" if len(found) > 4 else ""
        return "; ".join(found[:4]) + more

    def _refusal(self, path: Any) -> Optional[Tuple[str, str]]:
        """Why the folder ``trainer.resume_from_path`` names is refused (unless committed
        and intact): ``(kind, message)``, or None."""
        folder = Path(str(path))
        if not folder.is_dir():
            return "config", f"trainer.resume_from_path={path}: no such checkpoint folder"
        if not (folder / MARKER).is_file():
            return "checkpoint", (f"trainer.resume_from_path={path} is not a committed "
                                  f"checkpoint (no {MARKER} file: a save that never "
                                  "finished, or not a checkpoint folder); pick another or "
                                  "set trainer.resume_mode=auto")
        problem = self.problems(folder)
        if problem:
            return "checkpoint", (f"checkpoint {folder} is damaged: {problem}. Refusing to "
                                  "resume from it (trainer.resume_from_path names it); pick "
                                  "another, or set trainer.resume_mode=auto to take the "
                                  "newest intact one.")
        return None

    def load(self, path: Path, engines: Dict[str, Any], comm: Any = None,
             needs_dataloader: bool = False) -> Dict[str, Any]:
        """Restore ``engines`` from the committed checkpoint ``path``; this worker's
        trainer state. Anything missing is refused before anything is loaded."""
        comm = comm if comm is not None else WorkerComm()
        path = Path(path)
        if not (path / MARKER).is_file():
            raise CheckpointError(f"checkpoint '{path}' is incomplete or not a checkpoint "
                                  f"(no {MARKER} file); pick another or set "
                                  "trainer.resume_mode=disable")
        try:
            return self._load(path, engines, comm, needs_dataloader)
        except DamagedCheckpointError as exc:
            raise CheckpointError(f"{exc}. Refusing to resume from it; pick another "
                                  "checkpoint, or set trainer.resume_mode=auto to take "
                                  "the newest intact one.") from exc

    def _load(self, path: Path, engines: Dict[str, Any], comm: Any,
              needs_dataloader: bool) -> Dict[str, Any]:
        problem, state = None, None
        try:
            state = load_state(path, comm.rank, needs_dataloader)
        except DamagedCheckpointError as exc:
            problem = str(exc)
        problems = [p for p in comm.all_gather(problem) if p]  # all workers agree
        if problems:
            raise DamagedCheckpointError(problems[0])
        missing = [role for role in engines if not (path / role).is_dir()]
        if missing:
            raise DamagedCheckpointError(f"checkpoint {path} has no state for "
                                         f"{', '.join(missing)} ({missing[0]}/ is missing)")
        # each engine checks its own pieces before it changes anything
        for role, engine in engines.items():
            engine.load_checkpoint(str(path / role))
        return state
