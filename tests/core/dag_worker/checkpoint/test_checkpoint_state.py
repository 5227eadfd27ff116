"""The trainer state loads with ``weights_only=True`` and restores the RNGs exactly."""

import os
import pickle
import random

import numpy as np
import pytest
import torch

from siirl.dag_worker.checkpoint.errors import DamagedCheckpointError
from siirl.dag_worker.checkpoint.state import (
    load_state,
    rng_state,
    save_state,
    set_rng_state,
)


def draws():
    return (torch.rand(3).tolist(), random.random(), np.random.rand(3).tolist(),
            np.random.randn())  # randn leaves a cached gaussian in numpy's state


def test_rng_state_round_trips_exactly_through_a_weights_only_file(tmp_path):
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    np.random.randn()
    state = {"global_step": 4, "rng": rng_state(), "dataloader": {"epoch": 0},
             "algorithm": {"kl_ctrl": {"type": "fixed", "value": 0.1}}}
    save_state(tmp_path / "trainer_state.pt", state)
    want = draws()
    draws()  # move every generator on
    loaded = torch.load(tmp_path / "trainer_state.pt", weights_only=True)
    set_rng_state(loaded["rng"])
    assert draws() == want


def test_state_written_before_this_format_still_loads(tmp_path):
    """Older checkpoints held NumPy's state as an ndarray (pickled NumPy globals)."""
    np.random.seed(5)
    legacy = {"global_step": 2, "dataloader": {"epoch": 0, "batches_done": 2},
              "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                      "numpy": np.random.get_state()}}
    torch.save(legacy, tmp_path / "trainer_state.pt")
    want = np.random.rand(2).tolist()
    state = load_state(tmp_path, 0, needs_dataloader=True)
    set_rng_state(state["rng"])
    assert np.random.rand(2).tolist() == want


def test_a_pickle_that_runs_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (tmp_path / "trainer_state.pt").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(DamagedCheckpointError, match=r"trainer_state\.pt cannot be read"):
        load_state(tmp_path, 0, needs_dataloader=False)
    assert not marker.exists()


def test_a_worker_reads_its_own_state_or_rank_zeros(tmp_path):
    save_state(tmp_path / "trainer_state.pt", {"global_step": 1, "rng": {}, "who": 0})
    save_state(tmp_path / "trainer_state.rank1.pt", {"global_step": 1, "rng": {}, "who": 1})
    assert load_state(tmp_path, 1, False)["who"] == 1
    assert load_state(tmp_path, 2, False)["who"] == 0  # written by fewer workers


def test_missing_pieces_are_named(tmp_path):
    with pytest.raises(DamagedCheckpointError, match=r"no trainer_state\.pt"):
        load_state(tmp_path, 0, False)
    save_state(tmp_path / "trainer_state.pt", {"global_step": 1, "rng": {}})
    with pytest.raises(DamagedCheckpointError, match="lacks dataloader"):
        load_state(tmp_path, 0, needs_dataloader=True)


def test_saving_a_value_that_would_not_load_weights_only_is_caught_at_the_save(tmp_path):
    with pytest.raises(TypeError, match=r"state\.algorithm\.x is a ndarray"):
        save_state(tmp_path / "s.pt", {"algorithm": {"x": np.zeros(2)}})
