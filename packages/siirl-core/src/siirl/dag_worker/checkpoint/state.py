"""The trainer state of a checkpoint (``trainer_state.pt``, ``trainer_state.rankR.pt``):
step, dataloader position, RNG states, algorithm state.

Saved with ``torch.save`` but only of plain values (dicts, lists, tuples, str, numbers,
None, tensors), so it loads with ``torch.load(weights_only=True)``: a checkpoint folder
from elsewhere cannot run code. NumPy's RNG keys are stored as an int64 tensor for that
reason (exactly the same values). Files written before this format held a NumPy array;
they still load, with only NumPy's array reconstruction allowed besides the plain types.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any, Dict

import numpy as np
import torch

from siirl.dag_worker.checkpoint.errors import DamagedCheckpointError

REQUIRED = ("global_step", "rng")
_PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def state_file(rank: int) -> str:
    return "trainer_state.pt" if rank == 0 else f"trainer_state.rank{rank}.pt"


def rng_state() -> Dict[str, Any]:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos),
                      int(has_gauss), float(gauss))}


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(tuple(state["python"]))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    if isinstance(keys, torch.Tensor):
        keys = keys.numpy()
    np.random.set_state((name, np.asarray(keys).astype(np.uint32), pos, has_gauss, gauss))


def _check_plain(value: Any, where: str) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key, where)
            _check_plain(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
    elif not isinstance(value, _PLAIN):
        # a bug of whoever added the value: caught at the save, not at a later resume
        raise TypeError(f"trainer state {where} is a {type(value).__name__}; checkpoints "
                        "hold plain values and tensors only (they load with "
                        "weights_only=True)")


def save_state(path: Path, state: Dict[str, Any]) -> None:
    _check_plain(state, "state")
    torch.save(state, path)


def _legacy_globals() -> list:
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype,
            type(np.dtype(np.uint32))]


def load_state(folder: Path, rank: int, needs_dataloader: bool) -> Dict[str, Any]:
    """This worker's state (rank 0's when the checkpoint was written by fewer workers:
    data position and step are shared); refuses a state that lacks what the run needs."""
    folder = Path(folder)
    own = folder / state_file(rank)
    path = own if own.is_file() else folder / state_file(0)
    if not path.is_file():
        raise DamagedCheckpointError(f"checkpoint {folder} has no {state_file(0)} (the "
                                     "step, dataloader position and RNG states)")
    try:
        with torch.serialization.safe_globals(_legacy_globals()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "pickle protocol 4" of a foreign file: refused
            state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # unpickling refused, truncated zip, bad magic: all damage
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DamagedCheckpointError(f"checkpoint {folder}: {path.name} cannot be read "
                                     f"safely ({first[:200]})") from exc
    missing = [key for key in REQUIRED if not isinstance(state, dict) or key not in state]
    if not missing and needs_dataloader and state.get("dataloader") is None:
        missing = ["dataloader"]
    if missing:
        raise DamagedCheckpointError(f"checkpoint {folder}: {path.name} lacks "
                                     f"{', '.join(missing)}, which this run needs to resume")
    return state

