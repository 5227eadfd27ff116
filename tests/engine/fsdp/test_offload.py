"""CPU offload (``fsdp_config.param_offload`` / ``optimizer_offload`` / ``offload_policy``):
refused on a CPU run, naming the key; on a GPU run FSDP2 gets a ``CPUOffloadPolicy``.
The real offloaded path runs on a GPU machine only: ``tools/gpu/check_offload.py`` (the
``gpu`` test below runs it)."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from siirl.engine.fsdp import offload, sharding
from siirl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
KEYS = ["actor_rollout_ref.actor.fsdp_config.param_offload",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
        "actor_rollout_ref.ref.fsdp_config.param_offload",
        "critic.model.fsdp_config.offload_policy"]


@pytest.mark.parametrize("key", KEYS[:2])
def test_siirl_train_on_the_cpu_stops_naming_the_key(key, tmp_path):
    script = Path(sys.executable).with_name("siirl-train")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "siirl.main_dag"]
    proc = subprocess.run([*command, "trainer.device=cpu", f"{key}=true",
                           f"trainer.default_local_dir={tmp_path}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert key in proc.stderr and "nothing to offload" in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("key", KEYS)
def test_every_offload_key_is_refused_on_a_cpu_run(key):
    from siirl.params.parser import parse_config

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config([f"{key}=true", "trainer.device=cpu"])


def fsdp_config(**asked):
    return SimpleNamespace(**{k: asked.get(k, False) for k in offload.KEYS})


def test_the_engine_refuses_where_offload_cannot_act():
    prefix = "actor_rollout_ref.actor.fsdp_config"
    assert not offload.wants_offload(fsdp_config(), prefix, torch.device("cpu"), False)
    with pytest.raises(ConfigError, match=rf"{prefix}\.optimizer_offload=true\b.* nothing"):
        offload.wants_offload(fsdp_config(optimizer_offload=True), prefix,
                              torch.device("cpu"), False)
    with pytest.raises(ConfigError, match="fsdp_size=1"):
        offload.wants_offload(fsdp_config(param_offload=True), prefix,
                              torch.device("cuda"), True)


def test_a_lone_worker_gets_a_world_of_one_to_offload_in():
    """siirl-train runs one worker without torch.distributed; FSDP2 (which is what offloads)
    needs a process group, so asking for offload starts a world of one (first seen on an
    H100: the one-GPU offloaded run was refused)."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    prefix = "actor_rollout_ref.actor.fsdp_config"
    try:
        assert offload.wants_offload(fsdp_config(param_offload=True), prefix,
                                     torch.device("cuda"), False)
        assert dist.is_initialized() and dist.get_world_size() == 1
    finally:
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def test_shard_fsdp2_passes_a_cpu_offload_policy(monkeypatch):
    """``fully_shard`` (mocked: a real CPU offload needs a GPU) gets FSDP2's policy on
    every decoder layer and the root, and none without ``offload``."""
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.fsdp as fsdp

    calls = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kw: calls.append((module, kw)))
    monkeypatch.setattr(device_mesh.DeviceMesh, "from_group",
                        staticmethod(lambda group, device_type: "mesh"))
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(3))
    sharding.shard_fsdp2(model, group="group", offload=True)
    assert [m for m, _ in calls] == [*model.layers, model]
    for _, kwargs in calls:
        assert isinstance(kwargs["offload_policy"], fsdp.CPUOffloadPolicy)
        assert kwargs["mesh"] == "mesh"
    calls.clear()
    sharding.shard_fsdp2(model, group="group")
    assert all("offload_policy" not in kwargs for _, kwargs in calls)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_offloaded_runs_train_like_resident_ones_on_a_gpu(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "tools/gpu/check_offload.py"),
                           "--out", str(tmp_path / "offload.json")],
                          capture_output=True, text=True, timeout=1800, cwd=ROOT)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-4000:]
