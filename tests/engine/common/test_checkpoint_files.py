"""Engine checkpoints refuse what is missing, damaged or foreign before they change the
module (issue 16, item 4): never half-loaded, never a silently fresh optimizer."""

import io
import os

import pytest
import torch

from siirl.dag_worker.checkpoint.errors import CheckpointError, DamagedCheckpointError
from siirl.dag_worker.checkpoint.manager import CheckpointManager
from siirl.engine.common import checkpoint as ckpt


def trained(out=2, seed=0):
    torch.manual_seed(seed)
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, out))
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    module(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    return module, optimizer


def fresh(out=2):
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, out))
    return module, torch.optim.AdamW(module.parameters(), lr=0.1)


def weights(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def saved(tmp_path):
    module, optimizer = trained()
    directory = str(tmp_path / "actor")
    ckpt.save_checkpoint(directory, module, optimizer, {"update_count": 1})
    return directory, module


def test_round_trip_restores_weights_optimizer_and_extra(saved):
    directory, module = saved
    target, optimizer = fresh()
    extra = ckpt.load_checkpoint(directory, target, optimizer)
    assert extra == {"update_count": 1} and same(weights(target), weights(module))
    assert len(optimizer.state) == 4


@pytest.mark.parametrize("name, said", [(ckpt.OPTIMIZER_FILE, "optimizer state"),
                                        (ckpt.EXTRA_FILE, "lr schedule"),
                                        (ckpt.MODEL_FILE, "model weights")])
def test_a_missing_piece_is_refused_before_anything_loads(saved, name, said):
    directory, _ = saved
    os.remove(os.path.join(directory, name))
    target, optimizer = fresh()
    before = weights(target)
    with pytest.raises(DamagedCheckpointError, match=f"{name}.*{said}|{said}"):
        ckpt.load_checkpoint(directory, target, optimizer)
    assert same(weights(target), before) and not optimizer.state


def test_a_checkpoint_saved_without_optimizer_is_refused_by_a_run_that_needs_one(tmp_path):
    module, optimizer = trained()
    directory = str(tmp_path / "actor")
    ckpt.save_checkpoint(directory, module, optimizer, {}, contents=("model", "extra"))
    with pytest.raises(DamagedCheckpointError, match="optimizer"):
        ckpt.load_checkpoint(directory, *fresh())
    target, _ = fresh()  # a run that loads weights only may
    ckpt.load_checkpoint(directory, target, None, contents=("model",))
    assert same(weights(target), weights(module))


@pytest.mark.parametrize("name", [ckpt.MODEL_FILE, ckpt.OPTIMIZER_FILE, ckpt.EXTRA_FILE])
def test_a_truncated_file_is_damage_named_by_file(saved, name):
    directory, _ = saved
    path = os.path.join(directory, name)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])
    target, optimizer = fresh()
    before = weights(target)
    with pytest.raises(DamagedCheckpointError, match=f"{name} cannot be read"):
        ckpt.load_checkpoint(directory, target, optimizer)
    assert same(weights(target), before)


def test_another_models_checkpoint_is_refused_as_a_mismatch_not_damage(saved):
    directory, _ = saved
    target, optimizer = fresh(out=3)
    before = weights(target)
    with pytest.raises(CheckpointError, match=r"shape mismatch.*\[2, 8\].*\[3, 8\]") as info:
        ckpt.load_checkpoint(directory, target, optimizer)
    assert not isinstance(info.value, DamagedCheckpointError)
    assert directory in str(info.value) and same(weights(target), before)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_sharded_checkpoint_without_optimizer_state_is_refused(tmp_path):
    import torch.distributed.checkpoint as dcp

    module, optimizer = trained()
    directory = tmp_path / "actor"
    dcp.save({"model": module.state_dict()}, checkpoint_id=str(directory / ckpt.SHARDED_DIR),
             no_dist=True)
    torch.save({}, directory / ckpt.EXTRA_FILE)
    with pytest.raises(DamagedCheckpointError, match="no optimizer state"):
        ckpt.load_checkpoint(str(directory), *fresh())
    with pytest.raises(CheckpointError, match="shape mismatch"):
        ckpt.load_checkpoint(str(directory), *fresh(out=3))


class Engine:
    """The smallest engine over the real checkpoint files."""

    def __init__(self, module, optimizer):
        self.module, self.optimizer = module, optimizer

    def save_checkpoint(self, directory):
        ckpt.save_checkpoint(directory, self.module, self.optimizer, {"update_count": 1})

    def load_checkpoint(self, directory):
        ckpt.load_checkpoint(directory, self.module, self.optimizer)


STATE = {"global_step": 0, "rng": {}, "dataloader": {"epoch": 0, "batches_done": 0}}


@pytest.mark.parametrize("damage", ["flip_safetensors", "truncate_optimizer",
                                    "delete_optimizer"])
def test_damaged_newest_checkpoint_resumes_the_previous_weights_not_nan(tmp_path, damage):
    manager = CheckpointManager(str(tmp_path), stream=io.StringIO())
    module, optimizer = trained(seed=1)
    manager.save(1, {"actor": Engine(module, optimizer)}, {**STATE, "global_step": 1})
    at_step_1 = weights(module)
    module(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    manager.save(2, {"actor": Engine(module, optimizer)}, {**STATE, "global_step": 2})
    newest = tmp_path / "global_step_2" / "actor"
    if damage == "flip_safetensors":  # 256 bytes of tensor data: still a valid file
        data = bytearray((newest / ckpt.MODEL_FILE).read_bytes())
        data[-256:] = bytes(b ^ 0xFF for b in data[-256:])
        (newest / ckpt.MODEL_FILE).write_bytes(bytes(data))
    elif damage == "truncate_optimizer":
        data = (newest / ckpt.OPTIMIZER_FILE).read_bytes()
        (newest / ckpt.OPTIMIZER_FILE).write_bytes(data[:100])
    else:
        (newest / ckpt.OPTIMIZER_FILE).unlink()
    target = Engine(*fresh())
    folder, state = manager.restore({"actor": target}, needs_dataloader=True)
    assert folder.name == "global_step_1" and state["global_step"] == 1
    assert same(weights(target.module), at_step_1)
    assert all(torch.isfinite(v).all() for v in weights(target.module).values())
    said = manager.stream.getvalue()
    assert "global_step_2" in said and "actor/" in said and said.count("warning:") == 1
