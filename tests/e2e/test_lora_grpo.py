"""GRPO with LoRA end to end (CPU, the built-in tiny model): ``siirl-train`` with verl's
LoRA keys trains the adapters, checkpoints hold the adapters only (a peft adapter folder),
and a run resumed from step 1 repeats step 2 bitwise."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from siirl_suites import megatron_full

pytest.importorskip("peft", reason='peft is not installed: pip install "siirl-engine[lora]"')

LORA = ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.model.target_modules=all-linear"]
SMALL = ["algorithm.adv_estimator=grpo", "data.train_batch_size=8",
         "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
         "actor_rollout_ref.actor.use_kl_loss=true",  # the reference: adapters off
         "actor_rollout_ref.actor.optim.lr=1e-3", "trainer.logger=[]",
         "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.device=cpu",
         "trainer.total_training_steps=2", "trainer.save_freq=1"]
IGNORED = ("timing_s/", "perf/")


def siirl_train(run_dir, *overrides, env=None):
    script = Path(sys.executable).with_name("siirl-train")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "siirl.main_dag"]
    proc = subprocess.run([*command, f"trainer.default_local_dir={run_dir}", *SMALL, *LORA,
                           *overrides], capture_output=True, text=True, timeout=300,
                          env=dict(env or os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return proc


def training(run_dir):
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text()
               .splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(IGNORED)}
            for r in records if "critic/score/mean" in r}


def test_lora_grpo_trains_checkpoints_adapters_and_resumes_exactly(tmp_path):
    straight = tmp_path / "straight"
    siirl_train(straight)
    steps = training(straight)
    assert sorted(steps) == [1, 2]
    for record in steps.values():
        assert record["actor/grad_norm"] > 0
        assert "actor/pg_loss" in record and "actor/kl_loss" in record

    actor = straight / "global_step_1" / "actor"
    files = sorted(p.name for p in actor.iterdir())
    assert files == ["adapter_config.json", "adapter_model.safetensors", "extra.pt",
                     "huggingface", "optimizer.pt"]  # no full model weights
    from safetensors import safe_open

    with safe_open(str(actor / "adapter_model.safetensors"), framework="pt") as handle:
        names = list(handle.keys())
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    config = json.loads((actor / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16
    export = sorted(p.name for p in (actor / "huggingface").iterdir())
    assert "adapter_model.safetensors" in export and "model.safetensors" not in export

    resumed = tmp_path / "resumed"
    proc = siirl_train(resumed, f"trainer.resume_from_path={straight / 'global_step_1'}",
                       "trainer.resume_mode=resume_path")
    assert "resumed from" in proc.stdout
    again = training(resumed)
    assert sorted(again) == [2]
    assert again[2] == steps[2]  # bitwise: every metric of step 2


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None,
                    reason='megatron-core is not installed: pip install "siirl-engine[megatron]"')
def test_megatron_lora_grpo_checkpoints_peft_adapters_and_resumes_exactly(tmp_path):
    """strategy=megatron with the same keys: the checkpoint is a peft adapter folder with
    HF names (no megatron weights), the reference is the base model (KL 0 at step 1), and a
    resumed run repeats step 2 bitwise."""
    megatron = ["actor_rollout_ref.actor.strategy=megatron"]
    straight = tmp_path / "straight"
    siirl_train(straight, *megatron, "actor_rollout_ref.model.lora_merge_on_export=true")
    steps = training(straight)
    assert sorted(steps) == [1, 2] and steps[1]["actor/kl_loss"] == 0.0
    assert steps[2]["actor/kl_loss"] > 0 and steps[1]["actor/grad_norm"] > 0
    actor = straight / "global_step_1" / "actor"
    assert sorted(p.name for p in actor.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "dist_optim", "extra.pt",
        "huggingface"]
    from safetensors import safe_open

    with safe_open(str(actor / "adapter_model.safetensors"), framework="pt") as handle:
        names = list(handle.keys())
    assert names and all(n.startswith("base_model.model.model.layers.") and
                         (".lora_A." in n or ".lora_B." in n) for n in names)
    assert json.loads((actor / "adapter_config.json").read_text())["r"] == 8
    export = actor / "huggingface"
    assert (export / "adapter_model.safetensors").exists()
    assert (export / "merged" / "model.safetensors").exists()  # W + s*B@A, a plain HF folder

    resumed = tmp_path / "resumed"
    siirl_train(resumed, *megatron, f"trainer.resume_from_path={straight / 'global_step_1'}",
                "trainer.resume_mode=resume_path")
    again = training(resumed)[2]
    # the resumed run syncs the loaded weights to the rollout once more before its step 2
    assert again.pop("weight_sync/bytes") == 2 * steps[2].pop("weight_sync/bytes")
    assert again == steps[2]  # bitwise: every other metric of step 2


MEGATRON_ONE_CHECKPOINT = ["actor_rollout_ref.actor.strategy=megatron", "trainer.save_freq=2"]


@pytest.fixture(scope="module")
def megatron_lora_one_worker(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tp1")
    siirl_train(run_dir, *MEGATRON_ONE_CHECKPOINT)
    return training(run_dir)


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None,
                    reason='megatron-core is not installed: pip install "siirl-engine[megatron]"')
@megatron_full
@pytest.mark.parametrize("layout", [
    ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"],
    ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
     "actor_rollout_ref.actor.megatron.sequence_parallel=true"],
    ["actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"],
], ids=["tp2", "tp2-sp", "pp2"])
def test_megatron_lora_on_two_workers_trains_like_one_worker(tmp_path, layout,
                                                             megatron_lora_one_worker):
    """TP=2 (adapters split like the base weights), TP=2 with sequence parallelism, PP=2
    (each stage its layers' adapters) on two Ray CPU workers give the losses and grad norms
    of one worker within float32 rounding over the steps; the step-2 checkpoint holds every
    stage's adapters."""
    import tempfile

    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS="")
    siirl_train(tmp_path / "two", *MEGATRON_ONE_CHECKPOINT, *layout,
                "trainer.n_gpus_per_node=2", "trainer.ray_address=local",
                f"trainer.ray_temp_dir={tempfile.mkdtemp(prefix='ray', dir='/tmp')}", env=env)
    from safetensors import safe_open

    adapters = tmp_path / "two" / "global_step_2" / "actor" / "adapter_model.safetensors"
    with safe_open(str(adapters), framework="pt") as handle:
        layers = {name.split(".")[4] for name in handle.keys()}
    assert layers == {"0", "1", "2"}  # the tiny model's layers, over both stages at PP=2
    one, two = megatron_lora_one_worker, training(tmp_path / "two")
    assert sorted(one) == sorted(two) == [1, 2]
    for step in (1, 2):
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean"):
            want = one[step][key]
            assert abs(two[step][key] - want) <= 1e-5 * max(1.0, abs(want)), (step, key)
