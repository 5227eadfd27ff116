"""The main job on 2 CPU worker processes (Ray actors, gloo) against the 1-worker run.

Same seed and global batch: the 2-worker run must train exactly like the 1-worker run
(first step's actor loss and gradient norm within 1e-5), log each step once, write
checkpoints that both layouts resume from, and stop within 60 s when a worker is killed.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

SMALL = ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=16", "trainer.logger=[]",
         "trainer.val_before_train=false", "trainer.device=cpu", "trainer.seed=7"]
TWO = ["trainer.n_gpus_per_node=2", "trainer.ray_address=local"]
TOL = 1e-5


HERE = Path(__file__).parent


def _env():
    # Ray 2.60 turns on token auth (a token under $HOME) unless told otherwise; the workers
    # of the local cluster inherit PYTHONPATH, so they import this directory's helpers
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS="", PYTHONPATH=path)


def _cmd(run_dir, ray_dir, overrides):
    return [sys.executable, "-m", "siirl.main_dag", f"trainer.default_local_dir={run_dir}",
            f"trainer.ray_temp_dir={ray_dir}", *SMALL, *overrides]


def train(run_dir, *overrides, timeout=300, ok=True):
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths
    proc = subprocess.run(_cmd(run_dir, ray_dir, overrides), capture_output=True, text=True,
                          env=_env(), timeout=timeout)
    assert (proc.returncode == 0) == ok, proc.stderr[-4000:]
    return proc


def steps(run_dir):
    out = {}
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        kind = "val" if "val/score/mean" in record else "train"
        key = (kind, record["step"])
        assert key not in out, f"{key} logged twice"
        out[key] = record
    return out


def assert_close(a, b, keys):
    for key in keys:
        assert abs(a[key] - b[key]) <= TOL * max(1.0, abs(a[key])), (key, a[key], b[key])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One worker for 3 steps; two workers for 2 steps (checkpoint at 2), resumed to 3."""
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    common = ["trainer.save_freq=2", "trainer.test_freq=2"]
    train(one, *common, "trainer.total_training_steps=3")
    train(two, *common, *TWO, "trainer.total_training_steps=2")
    first_leg = steps(two)
    train(two, *common, *TWO, "trainer.total_training_steps=3")
    return one, two, first_leg


def test_two_workers_train_like_one(runs):
    one, _, first_leg = runs
    a, b = steps(one), first_leg
    assert sorted(b) == [("train", 1), ("train", 2), ("val", 2)]
    assert_close(a[("train", 1)], b[("train", 1)],
                 ["actor/pg_loss", "actor/grad_norm", "critic/score/mean",
                  "response_length/mean", "actor/entropy"])
    assert_close(a[("train", 2)], b[("train", 2)], ["actor/pg_loss", "actor/grad_norm"])
    # validation covers the whole set once, split over both workers
    assert_close(a[("val", 2)], b[("val", 2)], ["val/score/mean", "val/response_length/mean"])


def test_two_worker_checkpoint_is_committed_once_all_ranks_wrote(runs):
    _, two, _ = runs
    ckpt = Path(two) / "global_step_2"
    assert (ckpt / "COMMITTED").is_file()
    assert (ckpt / "trainer_state.pt").is_file() and (ckpt / "trainer_state.rank1.pt").is_file()
    assert (ckpt / "actor" / "huggingface" / "config.json").is_file()
    assert not list(Path(two).glob(".*.partial"))
    workers = json.loads((Path(two) / "workers.json").read_text())
    assert [w["rank"] for w in workers] == [0, 1]


def test_resumed_two_worker_run_continues_exactly(runs, tmp_path):
    one, two, _ = runs
    resumed = steps(two)
    assert ("train", 3) in resumed and ("train", 1) in resumed  # appended after step 2
    assert_close(steps(one)[("train", 3)], resumed[("train", 3)],
                 ["actor/pg_loss", "actor/grad_norm", "critic/score/mean"])
    # a 2-worker checkpoint also resumes on 1 worker (full weights, shared data position)
    single = tmp_path / "single"
    train(single, "trainer.total_training_steps=3", "trainer.save_freq=-1",
          "trainer.test_freq=-1", f"trainer.resume_from_path={Path(two) / 'global_step_2'}",
          "trainer.resume_mode=resume_path")
    assert_close(resumed[("train", 3)], steps(single)[("train", 3)],
                 ["actor/pg_loss", "actor/grad_norm", "critic/score/mean"])


REPLICATE = [f"{prefix}.fsdp_config.fsdp_size=1"
             for prefix in ("actor_rollout_ref.actor", "actor_rollout_ref.ref")]


def test_replicated_workers_train_like_one_and_resume_sharded(runs, tmp_path):
    """fsdp_size=1: whole-model replicas train like one worker; their checkpoint is one
    whole copy written by rank 0, and a sharded 2-worker run resumes from it exactly."""
    one = steps(runs[0])
    rep = tmp_path / "rep"
    train(rep, *TWO, *REPLICATE, "trainer.total_training_steps=2", "trainer.save_freq=2",
          "trainer.test_freq=-1")
    first = steps(rep)
    for step in (1, 2):
        assert_close(one[("train", step)], first[("train", step)],
                     ["actor/pg_loss", "actor/grad_norm", "critic/score/mean"])
    actor = rep / "global_step_2" / "actor"
    assert (actor / "model.safetensors").is_file() and not (actor / "dcp").exists()
    train(rep, *TWO, "trainer.total_training_steps=3", "trainer.save_freq=-1",
          "trainer.test_freq=-1")  # the default layout: FSDP2 shards of the replicas' copy
    assert_close(one[("train", 3)], steps(rep)[("train", 3)],
                 ["actor/pg_loss", "actor/grad_norm", "critic/score/mean"])


def test_tensor_parallel_rollout_feeds_data_parallel_training(runs, tmp_path):
    """Rollout at tensor-parallel size 2 (both workers read and generate the same rows),
    training data parallel over both: the DataBuffer moves half the rows, and the result
    is still the 1-worker run's."""
    one, _, _ = runs
    train(tmp_path, *TWO, "trainer.total_training_steps=1", "trainer.save_freq=-1",
          "trainer.test_freq=-1", "actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    got, want = steps(tmp_path)[("train", 1)], steps(one)[("train", 1)]
    assert_close(want, got, ["actor/pg_loss", "actor/grad_norm", "critic/score/mean"])
    # both workers share a node: the rows go through shared memory, a note over gloo (to
    # the first node with the actor's layout: the update, the old-log-prob node being left
    # out on-policy)
    assert got["databuffer/actor_train/shared_bytes"] > 0
    assert got["databuffer/actor_train/bytes_sent"] > 0


def test_a_raising_worker_stops_the_job_with_its_rank_and_traceback(tmp_path):
    start = time.monotonic()
    proc = train(tmp_path, *TWO, "dag.custom_pipeline_fn=siirl_e2e_failing:rank_one_fails",
                 "trainer.total_training_steps=50", "trainer.save_freq=-1",
                 "trainer.test_freq=-1", ok=False)
    assert proc.returncode == 1  # the exit code of the same error with one worker
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("siirl-train: error: worker rank 1 (pid"), last
    assert "boom on rank 1 at step 2" in last and "siirl_e2e_failing.py:18" in last
    assert time.monotonic() - start < 120
    # --traceback: the failing worker's own traceback
    proc = train(tmp_path, *TWO, "dag.custom_pipeline_fn=siirl_e2e_failing:rank_one_fails",
                 "trainer.total_training_steps=50", "--traceback", ok=False)
    assert "worker rank 1 (pid" in proc.stderr and "failed; the job was stopped" in proc.stderr
    assert "RuntimeError: boom on rank 1 at step 2" in proc.stderr
    assert 'siirl_e2e_failing.py", line 18, in fail_on_rank_one' in proc.stderr


def test_killing_a_worker_stops_the_job_within_60s(tmp_path):
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    proc = subprocess.Popen(_cmd(tmp_path, ray_dir, [*TWO, "trainer.total_training_steps=500",
                                                     "trainer.save_freq=-1",
                                                     "trainer.test_freq=-1"]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=_env())
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.5)
    victim = json.loads((tmp_path / "workers.json").read_text())[1]
    os.kill(victim["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the job was still running 60 s after a worker was killed")
    assert time.monotonic() - killed_at < 60
    assert proc.returncode != 0
    assert f"worker rank 1 (pid {victim['pid']}" in err and "died" in err, err[-3000:]


def test_dynamic_batch_size_on_two_workers_trains_like_one_fixed(runs, tmp_path):
    """use_dynamic_bsz on 2 workers: each rank cuts its micro-batches by tokens and both
    run the larger count (FSDP gathers in lockstep); the first step is the 1-worker run's."""
    one, _, _ = runs
    train(tmp_path, *TWO, "trainer.total_training_steps=1", "trainer.save_freq=-1",
          "trainer.test_freq=-1", "actor_rollout_ref.actor.use_dynamic_bsz=true",
          "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64",
          "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=64",
          "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=64")
    assert_close(steps(one)[("train", 1)], steps(tmp_path)[("train", 1)],
                 ["actor/pg_loss", "actor/grad_norm", "critic/score/mean"])
