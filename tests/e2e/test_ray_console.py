"""What a multi-worker run says about its Ray cluster, on a console that is a pipe: the
cluster it started or joined, worker lines without colour codes, and a cluster that is gone
(a stale record before the run, its GCS killed during it) ending the command with one
paragraph naming the address and trainer.ray_address=local, well within Ray's own 60 s."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

HERE = Path(__file__).parent
TINY = ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16", "trainer.logger=[console]",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.device=cpu", "trainer.n_gpus_per_node=2"]


def _env(ray_tmp):
    """Ray's record of `ray start` clusters in a folder of this test's own."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(ray_tmp))
    for key in ("RAY_ADDRESS", "RAY_COLOR_PREFIX"):
        env.pop(key, None)
    return env


def _cmd(run_dir, *overrides):
    return [sys.executable, "-m", "siirl.main_dag", f"trainer.default_local_dir={run_dir}",
            *TINY, *overrides]


def _short_tmp():
    return Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's socket paths


def test_a_private_cluster_is_announced_and_worker_lines_carry_no_colour(tmp_path):
    ray_tmp = _short_tmp()
    proc = subprocess.run(_cmd(tmp_path, "trainer.total_training_steps=2",
                               f"trainer.ray_temp_dir={ray_tmp / 'session'}"),
                          capture_output=True, text=True, env=_env(ray_tmp), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("siirl: started a private Ray cluster at "), proc.stdout
    assert "(WorkerProcess pid=" in proc.stdout and "step 2:" in proc.stdout
    assert "\x1b[" not in proc.stdout + proc.stderr


def test_a_stale_recorded_cluster_stops_the_command_at_once(tmp_path):
    from siirl.execution.scheduler.process_group_manager import free_port

    ray_tmp = _short_tmp()
    (ray_tmp / "ray").mkdir()
    address = f"127.0.0.1:{free_port()}"  # a cluster that was recorded, then went away
    (ray_tmp / "ray" / "ray_current_cluster").write_text(address)
    started = time.monotonic()
    proc = subprocess.run(_cmd(tmp_path), capture_output=True, text=True, env=_env(ray_tmp),
                          timeout=120)
    assert time.monotonic() - started < 60
    assert proc.returncode == 2, proc.stderr[-3000:]
    message = proc.stderr.strip()
    assert message.startswith(f"siirl-train: error: the address `ray start` recorded in "
                              f"{ray_tmp}/ray/ray_current_cluster ({address}): no Ray cluster "
                              "answers there")
    assert "Add trainer.ray_address=local" in message and "\n" not in message


def _end_leftovers(ray_tmp):
    """The node's agents outlive a cluster whose GCS was killed: end the processes that
    hold files of this test's cluster open (its logs, under its own RAY_TMPDIR)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            held = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:
            continue
        if any(path.startswith(f"{ray_tmp}/") for path in held):
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture
def recorded_cluster():
    """A one-node cluster started outside the command, recorded where `ray start` records."""
    from ray.cluster_utils import Cluster

    ray_tmp = _short_tmp()
    before = {key: os.environ.get(key) for key in ("RAY_AUTH_MODE", "RAY_TMPDIR")}
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(ray_tmp))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2,
                                                            "include_dashboard": False})
    try:
        yield cluster, ray_tmp
    finally:
        cluster.shutdown()
        _end_leftovers(ray_tmp)
        for key, value in before.items():
            os.environ.pop(key, None) if value is None else os.environ.update({key: value})


def test_a_joined_cluster_that_goes_away_ends_the_command_with_one_paragraph(
        tmp_path, recorded_cluster):
    cluster, ray_tmp = recorded_cluster
    address = cluster.address
    proc = subprocess.Popen(_cmd(tmp_path, "trainer.total_training_steps=500"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(ray_tmp))
    try:
        lines = []
        for line in proc.stdout:  # until the job trains
            lines.append(line)
            if "step 1:" in line:
                break
        assert lines and lines[0].startswith(
            f"siirl: joined the Ray cluster at {address} (`ray start` recorded in "
            f"{ray_tmp}/ray/ray_current_cluster), which this command did not start"), lines
        cluster.head_node.kill_gcs_server()  # its owner stops it
        lost = time.monotonic()
        _, err = proc.communicate(timeout=120)
        assert time.monotonic() - lost < 60  # Ray alone: 60 s, then its raw GCS error
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err[-3000:]
    message = err.strip().splitlines()[-1]
    assert message.startswith(f"siirl-train: error: the Ray cluster at {address} "
                              "(`ray start` recorded in"), err[-3000:]
    assert "stopped answering while the job ran" in message
    assert "add trainer.ray_address=local" in message
    assert "Failed to connect to GCS" not in err
