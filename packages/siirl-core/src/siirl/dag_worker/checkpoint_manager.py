"""Checkpoints under ``trainer.default_local_dir/global_step_N/``.

Layout of one checkpoint::

    global_step_N/
      actor/                 engine state (model, optimizer, scheduler), per stateful role
      actor/huggingface/     save_pretrained export, loadable by transformers alone
      trainer_state.pt       step, dataloader position, RNG states, algorithm state
      trainer_state.rankR.pt the same for worker R > 0 (its own RNG states)
      COMMITTED              written last, by rank 0, once every worker has finished

A checkpoint is written into ``.global_step_N.partial`` and renamed when complete, and only
directories holding ``COMMITTED`` are ever resumed from, so a crash mid-save never leaves
a checkpoint that looks complete. ``latest_checkpointed_iteration.txt`` (verl's name)
records the newest step.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch

from siirl.errors import ConfigError

PREFIX = "global_step_"
MARKER = "COMMITTED"
LATEST = "latest_checkpointed_iteration.txt"
STATEFUL_ROLES = ("actor", "critic")


def rng_state() -> Dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": np.random.get_state()}


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def state_file(rank: int) -> str:
    return "trainer_state.pt" if rank == 0 else f"trainer_state.rank{rank}.pt"


class _Solo:
    rank, is_chief = 0, True

    def barrier(self) -> None:
        pass


class CheckpointManager:
    def __init__(self, root: str, max_to_keep: Optional[int] = None):
        self.root = Path(root)
        self.max_to_keep = max_to_keep

    def committed_steps(self) -> list:
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
        return self.root / f"{PREFIX}{steps[-1]}" if steps else None

    def save(self, step: int, engines: Dict[str, Any], trainer_state: Dict[str, Any],
             comm: Any = None) -> Path:
        """Write checkpoint ``step``; with several workers every one calls this (``comm``
        their ``WorkerComm``): each writes its own state, rank 0 commits after all did."""
        comm = comm if comm is not None else _Solo()
        final = self.root / f"{PREFIX}{step}"
        partial = self.root / f".{PREFIX}{step}.partial"
        if comm.is_chief:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        comm.barrier()
        for role, engine in engines.items():
            engine.save_checkpoint(str(partial / role))  # collective for sharded engines
            if hasattr(engine, "export_hf"):
                engine.export_hf(str(partial / role / "huggingface"))
        torch.save(trainer_state, partial / state_file(comm.rank))
        comm.barrier()  # every worker's files are on disk before the commit
        if comm.is_chief:
            self._commit(step, partial, final)
        comm.barrier()
        return final

    def _commit(self, step: int, partial: Path, final: Path) -> None:
        (partial / MARKER).write_text(json.dumps({"step": step, "time": time.time()}))
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        tmp_latest = self.root / f".{LATEST}.tmp"
        tmp_latest.write_text(str(step))
        os.replace(tmp_latest, self.root / LATEST)
        self._prune()

    def load(self, path: Path, engines: Dict[str, Any], rank: int = 0) -> Dict[str, Any]:
        """Restore ``engines`` and return this worker's trainer state (rank 0's when the
        checkpoint was written by fewer workers: data position and step are shared)."""
        path = Path(path)
        if not (path / MARKER).is_file():
            raise ConfigError(f"checkpoint '{path}' is incomplete or not a checkpoint "
                              f"(no {MARKER} file); pick another or set trainer.resume_mode="
                              "disable")
        for role, engine in engines.items():
            if not (path / role).is_dir():
                raise ConfigError(f"checkpoint '{path}' has no state for role '{role}'")
            engine.load_checkpoint(str(path / role))
        own = path / state_file(rank)
        return torch.load(own if own.is_file() else path / state_file(0), weights_only=False)

    def _prune(self) -> None:
        if not self.max_to_keep or self.max_to_keep <= 0:
            return
        for step in self.committed_steps()[:-self.max_to_keep]:
            shutil.rmtree(self.root / f"{PREFIX}{step}", ignore_errors=True)
