"""``actor_rollout_ref.actor.strategy=megatron`` end to end on CPU (built-in model, GRPO).

The megatron actor must train exactly like the fsdp one (its forward equals the HF
model's within float rounding), checkpoint through dist_checkpointing and resume exactly;
without megatron-core the job must stop at start-up with the pip line that fixes it.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from siirl_suites import megatron_full

pytest.importorskip("megatron.core")

SMALL = ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=16", "trainer.logger=[]",
         "trainer.val_before_train=false", "trainer.test_freq=-1"]
MEGATRON = ["actor_rollout_ref.actor.strategy=megatron"]


def train(run_dir, *overrides, ok=True, env=None):
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag",
                           f"trainer.default_local_dir={run_dir}", *SMALL, *overrides],
                          capture_output=True, text=True, timeout=600, env=env)
    assert (proc.returncode == 0) == ok, proc.stderr[-3000:]
    return proc


def steps(run_dir):
    return {r["step"]: r for r in map(json.loads, (Path(run_dir) / "metrics.jsonl")
                                      .read_text().splitlines()) if "actor/pg_loss" in r}


def ray_workers(n):
    """Overrides and environment for ``n`` Ray CPU workers on this machine."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS="")
    return ["trainer.device=cpu", f"trainer.n_gpus_per_node={n}", "trainer.ray_address=local",
            f"trainer.ray_temp_dir={tempfile.mkdtemp(prefix='ray', dir='/tmp')}"], env


def assert_close_steps(got, want, keys, steps_=(1, 2)):
    for step in steps_:
        for key in keys:
            assert abs(got[step][key] - want[step][key]) <= 1e-5 * max(1.0, abs(want[step][key])), \
                (step, key, got[step][key], want[step][key])


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("fsdp")
    train(run, "trainer.total_training_steps=2", "trainer.save_freq=-1")
    return steps(run)


def test_megatron_actor_trains_like_fsdp_and_resumes_exactly(tmp_path, fsdp_run):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train(whole, *MEGATRON, "trainer.total_training_steps=3", "trainer.save_freq=-1")
    a, b = fsdp_run, steps(whole)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean"):
        for step in (1, 2):  # step 2 also checks the weights synced back to the rollout
            assert abs(a[step][key] - b[step][key]) <= 1e-5 * max(1.0, abs(a[step][key])), key
    # the rollout's HF copy is refreshed from megatron's weights by the weight-sync step
    assert all(b[step]["weight_sync/bytes"] > 0 and "timing_s/weight_sync" in b[step]
               for step in b)
    train(parts, *MEGATRON, "trainer.total_training_steps=2", "trainer.save_freq=2")
    ckpt = parts / "global_step_2" / "actor"
    assert (ckpt / "dist_ckpt").is_dir() and (ckpt / "huggingface" / "config.json").is_file()
    train(parts, *MEGATRON, "trainer.total_training_steps=3", "trainer.save_freq=-1")
    resumed = steps(parts)[3]
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"):
        assert resumed[key] == pytest.approx(b[3][key], abs=1e-6), key


@megatron_full  # TP 2 trains on two workers in CI: test_megatron_expert_tp.py
def test_tensor_parallel_2_on_two_cpu_workers_trains_like_one_fsdp_worker(tmp_path, fsdp_run):
    """Two Ray CPU workers form one TP group: both read the same rows (the DataBuffer moves
    the rollout's rows to them), each holds half of every layer; loss and gradient norm
    equal the 1-worker fsdp run's."""
    overrides, env = ray_workers(2)
    train(tmp_path, *MEGATRON, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
          *overrides, "trainer.total_training_steps=2", "trainer.save_freq=2", env=env)
    assert_close_steps(steps(tmp_path), fsdp_run,
                       ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"))
    ckpt = tmp_path / "global_step_2" / "actor"
    assert json.loads((ckpt / "dist_optim" / "layout.json").read_text()) == \
        {"tp": 2, "pp": 1, "dp": 1}  # megatron's distributed optimizer, dist_checkpointing
    # the TP 2 checkpoint resumes on one worker at TP 1: dist_checkpointing reshards
    single = tmp_path / "single"
    proc = train(single, *MEGATRON, "trainer.total_training_steps=3", "trainer.save_freq=-1",
                 "trainer.resume_mode=resume_path",
                 f"trainer.resume_from_path={tmp_path / 'global_step_2'}")
    assert sorted(steps(single)) == [3]
    assert "optimizer starts fresh" in proc.stderr


PPO = ["algorithm.adv_estimator=gae", "trainer.total_training_steps=2", "trainer.save_freq=2"]
PPO_KEYS = ("critic/vf_loss", "critic/grad_norm", "critic/vpred_mean", "actor/grad_norm",
            "actor/pg_loss")


def test_data_parallel_2_shards_the_optimizer_and_trains_like_one_fsdp_worker(tmp_path,
                                                                              fsdp_run):
    """Two workers at TP 1 are two data-parallel replicas: megatron's DDP averages their
    gradients and the distributed optimizer gives each half of the Adam state."""
    overrides, env = ray_workers(2)
    train(tmp_path, *MEGATRON, *overrides, "trainer.total_training_steps=2",
          "trainer.save_freq=2", env=env)
    assert_close_steps(steps(tmp_path), fsdp_run,
                       ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"))
    ckpt = tmp_path / "global_step_2" / "actor"
    assert json.loads((ckpt / "dist_optim" / "layout.json").read_text()) == \
        {"tp": 1, "pp": 1, "dp": 2}


@pytest.fixture(scope="module")
def fsdp_ppo_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("fsdp_ppo")
    train(run, *PPO)
    return steps(run)


def test_megatron_critic_trains_like_the_fsdp_critic(tmp_path, fsdp_ppo_run):
    """PPO with actor, reference and critic on megatron equals PPO on fsdp (the critic's
    value head has the same seeded start); its checkpoint holds the GPTModel in
    dist_checkpointing form and the replicated value head beside it."""
    run = tmp_path / "megatron"
    train(run, *PPO, *MEGATRON, "critic.strategy=megatron")
    assert_close_steps(steps(run), fsdp_ppo_run, PPO_KEYS)
    critic = run / "global_step_2" / "critic"
    assert (critic / "dist_ckpt").is_dir() and (critic / "replicated_modules.pt").is_file()


@megatron_full  # PP 2 trains in CI: test_ppo_on_two_workers_trains_like_fsdp[pp2]
def test_pipeline_parallel_2_on_two_cpu_workers_trains_like_one_fsdp_worker(tmp_path,
                                                                            fsdp_run):
    """Two Ray CPU workers form one pipeline (the built-in model's 3 layers split 2 + 1):
    megatron's 1F1B schedule over two micro-batches, the PPO loss on the last stage,
    log-probs broadcast back; loss and grad norm equal the 1-worker fsdp run's, the
    rollout (which needs every layer on every worker) gets both stages' weights, and the
    checkpoint resumes on one worker at PP 1."""
    overrides, env = ray_workers(2)
    train(tmp_path, *MEGATRON, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", *overrides,
          "trainer.total_training_steps=2", "trainer.save_freq=2", env=env)
    assert_close_steps(steps(tmp_path), fsdp_run,
                       ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"))
    ckpt = tmp_path / "global_step_2" / "actor"
    assert json.loads((ckpt / "dist_optim" / "layout.json").read_text()) == \
        {"tp": 1, "pp": 2, "dp": 1}
    single = tmp_path / "single"
    proc = train(single, *MEGATRON, "trainer.total_training_steps=3", "trainer.save_freq=-1",
                 "trainer.resume_mode=resume_path",
                 f"trainer.resume_from_path={tmp_path / 'global_step_2'}")
    assert sorted(steps(single)) == [3]
    assert "optimizer starts fresh" in proc.stderr


DYNAMIC = ["actor_rollout_ref.actor.use_dynamic_bsz=true",
           "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64",
           "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=64",
           "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=64",
           "critic.ppo_max_token_len_per_gpu=64", "critic.forward_max_token_len_per_gpu=64"]


def test_dynamic_batch_size_trains_like_fixed_micro_batches(tmp_path, fsdp_ppo_run):
    """use_dynamic_bsz on actor, old/reference log-probs and critic (critic.use_dynamic_bsz
    follows the actor's): micro-batches cut by 64-token budgets, of different rows, through
    megatron's schedule; PPO equals the fixed-micro-batch fsdp run's."""
    train(tmp_path, *PPO, *MEGATRON, "critic.strategy=megatron", *DYNAMIC)
    assert_close_steps(steps(tmp_path), fsdp_ppo_run, PPO_KEYS)


def test_packed_rows_train_like_the_padded_fsdp_actor(tmp_path, fsdp_run):
    """use_remove_padding on the megatron actor and reference: each micro-batch runs as one
    packed row with a block-diagonal causal mask (no Transformer Engine); GRPO steps equal
    the padded fsdp run's."""
    train(tmp_path, *MEGATRON, "actor_rollout_ref.model.use_remove_padding=true",
          "trainer.total_training_steps=2", "trainer.save_freq=-1")
    assert_close_steps(steps(tmp_path), fsdp_run,
                       ("actor/pg_loss", "actor/grad_norm", "actor/entropy",
                        "critic/score/mean"))


def test_packed_rows_train_ppo_like_the_padded_fsdp_run(tmp_path, fsdp_ppo_run):
    """use_remove_padding on the megatron actor, reference and critic (its value model on
    the packed row's hidden states): PPO equals the padded fsdp run's."""
    train(tmp_path, *PPO, *MEGATRON, "critic.strategy=megatron",
          "actor_rollout_ref.model.use_remove_padding=true", "critic.model.use_remove_padding=true")
    assert_close_steps(steps(tmp_path), fsdp_ppo_run, PPO_KEYS)


@pytest.mark.parametrize("layout", [
    pytest.param(["actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"],
                 id="pp2"),
    # TP 2 with sequence parallelism over gloo in CI: test_megatron_tp_gloo.py; TP 2 trains
    # on two workers in CI: test_megatron_expert_tp.py
    pytest.param(["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                  "actor_rollout_ref.actor.megatron.sequence_parallel=true"],
                 id="tp2-sequence-parallel", marks=megatron_full),
])
def test_ppo_on_two_workers_trains_like_fsdp(tmp_path, fsdp_ppo_run, layout):
    """Actor, reference and critic on two workers: at PP 2 the critic's value head runs on
    the last stage; at TP 2 with sequence parallelism each rank normalises half of every
    (left-padded to even) sequence. PPO equals the 1-worker fsdp run either way."""
    overrides, env = ray_workers(2)
    train(tmp_path, *PPO, *MEGATRON, "critic.strategy=megatron", *layout, *overrides, env=env)
    assert_close_steps(steps(tmp_path), fsdp_ppo_run, PPO_KEYS)
    critic = tmp_path / "global_step_2" / "critic"
    assert (critic / "replicated_modules.pt").is_file()


def test_megatron_without_the_extra_names_the_pip_line(tmp_path):
    # a stand-in "megatron" package that fails like a missing megatron-core
    shim = tmp_path / "shim" / "megatron"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError(\"No module named 'megatron.core'\")\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(shim.parent), os.environ.get("PYTHONPATH")) if p))
    proc = train(tmp_path / "run", *MEGATRON, "trainer.total_training_steps=1", ok=False,
                 env=env)
    assert proc.returncode == 2
    assert 'pip install "siirl-engine[megatron]"' in proc.stderr
    assert "Traceback" not in proc.stderr
