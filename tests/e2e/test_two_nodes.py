"""GRPO on a Ray cluster of two nodes on this machine (``ray.cluster_utils.Cluster``, both
nodes on 127.0.0.1 with 1 CPU each): one worker per node, the rollout at tensor-parallel
size 2 so the DataBuffer moves rows between the nodes. It trains like the same job on two
workers of one node, a killed worker stops it with a clear error, and the same command then
resumes bitwise equal. An unreachable cluster address fails within 60 s naming it."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from test_main_job import _comparable
from test_multi_worker import TWO, _cmd, _env, steps

pytest.importorskip("ray")

STEPS = 4
COMMON = [f"trainer.total_training_steps={STEPS}", "trainer.save_freq=2", "trainer.test_freq=-1",
          "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]
LEARNING = ["actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean",
            "response_length/mean"]
LOOPBACK = "127.0.0.1"


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes bound to the loopback; Ray's files under a temporary folder."""
    from ray.cluster_utils import Cluster

    root = Path(tempfile.mkdtemp(prefix="rn", dir="/tmp"))  # short: Ray's socket paths
    (root / "ray").mkdir()
    env = {"RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": str(root)}
    before = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    nodes = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": LOOPBACK, "include_dashboard": False})
    nodes.add_node(num_cpus=1, node_ip_address=LOOPBACK)
    nodes.wait_for_nodes()
    try:
        yield nodes
    finally:
        nodes.shutdown()
        for key, value in before.items():
            os.environ.pop(key, None) if value is None else os.environ.update({key: value})
        shutil.rmtree(root, ignore_errors=True)


def on_two_nodes(cluster) -> list:
    return ["trainer.nnodes=2", "trainer.n_gpus_per_node=1", f"trainer.ray_node_ip={LOOPBACK}",
            f"trainer.ray_address={cluster.address}"]


def run(run_dir, overrides, timeout=420):
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # the 1-node run's local cluster
    return subprocess.run(_cmd(run_dir, ray_dir, [*COMMON, *overrides]), capture_output=True,
                          text=True, env=_env(), timeout=timeout)


def training(run_dir) -> dict:
    return {step: record for (kind, step), record in steps(run_dir).items() if kind == "train"}


@pytest.fixture(scope="module")
def two_nodes(cluster, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("two_nodes")
    proc = run(run_dir, on_two_nodes(cluster))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir, proc


def test_workers_land_on_distinct_nodes_of_the_loopback(cluster, two_nodes):
    run_dir, proc = two_nodes
    workers = json.loads((run_dir / "workers.json").read_text())
    assert [w["rank"] for w in workers] == [0, 1]
    assert len({w["node_id"] for w in workers}) == 2
    assert all(w["node_ip"] == LOOPBACK and w["host"] for w in workers)
    for w in workers:  # each worker's place is on the console
        assert f"worker rank {w['rank']} on {w['host']} ({LOOPBACK}, Ray node " \
               f"{w['node_id'][:8]}), pid {w['pid']}" in proc.stdout


def test_two_nodes_train_like_two_workers_of_one_node(two_nodes, tmp_path):
    run_dir, _ = two_nodes
    proc = run(tmp_path, TWO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    one_node, spread = training(tmp_path), training(run_dir)
    assert sorted(spread) == list(range(1, STEPS + 1))
    for step in spread:
        for key in LEARNING:
            assert spread[step][key] == one_node[step][key], (step, key)
    # rows cross between the nodes over gloo; within one node they go through shared memory
    moved = "databuffer/actor_train"  # the first actor node (old log-probs on-policy: none)
    assert spread[1][f"{moved}/bytes_sent"] > 0 and spread[1][f"{moved}/shared_bytes"] == 0
    assert one_node[1][f"{moved}/shared_bytes"] > 0


def test_a_killed_worker_stops_the_job_and_the_same_command_resumes_bitwise(
        cluster, two_nodes, tmp_path):
    straight, _ = two_nodes
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    long = [*COMMON, *on_two_nodes(cluster), "trainer.total_training_steps=200"]
    proc = subprocess.Popen(_cmd(tmp_path, ray_dir, long), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=_env())
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not ((tmp_path / "global_step_2" / "COMMITTED").exists() and metrics.is_file()
               and metrics.read_text().count("\n") >= 3):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "training never reached step 3"
        time.sleep(0.3)
    victim = json.loads((tmp_path / "workers.json").read_text())[1]
    os.kill(victim["pid"], signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the job was still running 60 s after a worker was killed")
    assert proc.returncode != 0
    assert f"worker rank 1 (pid {victim['pid']} on {LOOPBACK}) died" in err, err[-3000:]
    assert "Traceback" not in err.strip().splitlines()[-1]

    resumed = run(tmp_path, on_two_nodes(cluster))
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stdout
    a, b = training(straight), training(tmp_path)
    for step in (3, 4):
        assert _comparable(a[step]) == _comparable(b[step]), step


def test_an_unreachable_cluster_fails_within_60s_naming_the_address(tmp_path):
    from siirl.execution.scheduler.process_group_manager import free_port

    address = f"{LOOPBACK}:{free_port()}"  # nobody listens there
    started = time.monotonic()
    proc = run(tmp_path, ["trainer.nnodes=2", "trainer.n_gpus_per_node=1",
                          f"trainer.ray_address={address}", "trainer.ray_connect_timeout_s=5"],
               timeout=120)
    assert time.monotonic() - started < 60
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert f"trainer.ray_address={address}: no Ray cluster answers there within 5 s" in last
    assert "Traceback" not in proc.stderr


def test_asynchronous_pools_on_two_nodes(cluster, tmp_path):
    """An asynchronous job's trainer and rollout pools, one worker each, on the two nodes
    (each has room for one): rows stream and weights sync between the nodes over gloo."""
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    overrides = ["trainer.total_training_steps=3", "trainer.test_freq=-1",
                 "trainer.save_freq=-1", "async_training.enable=true",
                 "async_training.staleness_threshold=1", "trainer.n_gpus_per_node=1",
                 "rollout.nnodes=1", "rollout.n_gpus_per_node=1",
                 f"trainer.ray_node_ip={LOOPBACK}", f"trainer.ray_address={cluster.address}"]
    proc = subprocess.run(_cmd(tmp_path, ray_dir, overrides), capture_output=True, text=True,
                          env=_env(), timeout=420)
    assert proc.returncode == 0, proc.stderr[-4000:]
    workers = json.loads((tmp_path / "workers.json").read_text())
    assert len({w["node_id"] for w in workers}) == 2  # trainer on one, rollout on the other
    records = training(tmp_path)
    assert sorted(records) == [1, 2, 3]
    assert all(r["async/policy_lag/max"] <= 1 and r["weight_sync/bytes"] > 0
               for r in records.values())
