"""Which Ray cluster a multi-worker run uses, what the console says about it, and a cluster
that is gone (before the run: a stale record; during it: a refused address) ending the
command with one paragraph naming the address and trainer.ray_address=local."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("ray")

from siirl.errors import ConfigError  # noqa: E402
from siirl.launch import cluster_link  # noqa: E402
from siirl.launch.cluster_link import ClusterLink, check_recorded, choose  # noqa: E402
from siirl.params.typed import to_typed  # noqa: E402


def closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture
def ray_tmp(tmp_path, monkeypatch):
    """Ray's temporary folder (where `ray start` records its cluster) of this test only."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "ray").mkdir()
    return tmp_path / "ray"


def _config(address=None):
    return to_typed({"trainer": {"ray_address": address}})


def test_the_cluster_chosen(ray_tmp, monkeypatch):
    assert choose(_config("local")).address is None
    named = choose(_config("10.0.0.5:6379"))
    assert (named.address, named.named) == ("10.0.0.5:6379", "trainer.ray_address=10.0.0.5:6379")
    # nothing named, nothing recorded: a private cluster
    assert choose(_config()).address is None
    (ray_tmp / "ray_current_cluster").write_text("10.0.0.7:6379\n")
    recorded = choose(_config())
    assert recorded.address == "10.0.0.7:6379" and recorded.recorded
    assert str(ray_tmp / "ray_current_cluster") in recorded.source
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")  # the environment before the record
    assert choose(_config()).named == "RAY_ADDRESS=10.0.0.9:6379"
    assert choose(_config("local")).address is None  # local wins over both


def test_a_stale_record_stops_at_once_naming_the_address_and_the_override(ray_tmp):
    address = closed_port()
    (ray_tmp / "ray_current_cluster").write_text(address)
    with pytest.raises(ConfigError) as error:
        check_recorded(choose(_config()))
    text = str(error.value)
    assert text.startswith(f"the address `ray start` recorded in {ray_tmp}/ray_current_cluster "
                           f"({address}): no Ray cluster answers there (Connection refused)")
    assert "Add trainer.ray_address=local to run on a private cluster" in text
    assert "\n" not in text


def test_the_console_says_which_cluster(capsys):
    joined = ClusterLink("10.0.0.5:6379", "named by trainer.ray_address", "trainer.ray_address",
                         gcs="10.0.0.5:6379")
    joined.announce()
    assert capsys.readouterr().out == (
        "siirl: joined the Ray cluster at 10.0.0.5:6379 (named by trainer.ray_address), which "
        "this command did not start: other jobs may use it and stop it; "
        "trainer.ray_address=local runs on a private one\n")
    private = ClusterLink(None, "trainer.ray_address=local", started=True, gcs="10.0.0.5:4242")
    private.announce("/tmp/ray123")
    assert capsys.readouterr().out == (
        "siirl: started a private Ray cluster at 10.0.0.5:4242 for this command (it stops "
        "when the command ends; Ray's files in /tmp/ray123)\n")


def test_a_cluster_lost_mid_run_ends_the_command_and_this_machines_workers():
    code = textwrap.dedent("""
        import socket, subprocess, sys, time
        from siirl.launch.cluster_link import ClusterLink, ClusterWatch
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        gcs = f"127.0.0.1:{server.getsockname()[1]}"
        link = ClusterLink(gcs, "named by trainer.ray_address", "trainer.ray_address", gcs=gcs)
        worker = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        watch = ClusterWatch(link, every_s=0.1, misses=3).start()
        watch.workers = [{"pid": worker.pid, "host": socket.gethostname()}]
        time.sleep(0.5)
        print("alive", worker.poll(), worker.pid, flush=True)  # it answers: nothing happens
        server.close()  # the cluster goes away
        time.sleep(30)
        print("still running", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("alive None ")
    worker = lines[0].split()[-1]
    assert proc.returncode == 1
    message = proc.stderr.strip()
    assert message.startswith("siirl-train: error: the Ray cluster at 127.0.0.1:")
    assert "(named by trainer.ray_address; this command did not start it) stopped answering " \
           "while the job ran" in message
    assert "add trainer.ray_address=local" in message and "\n" not in message
    # the worker was ended, not left to train on
    try:
        state = (Path("/proc") / worker / "stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        state = "gone"
    if state not in ("gone", "Z"):
        os.kill(int(worker), signal.SIGKILL)
    assert state in ("gone", "Z"), state


def test_a_timeout_is_no_proof_of_loss(monkeypatch):
    link = ClusterLink("10.0.0.5:6379", "x", gcs="10.0.0.5:6379")

    def timing_out(*args, **kwargs):
        raise TimeoutError

    monkeypatch.setattr(cluster_link.socket, "create_connection", timing_out)
    assert not cluster_link.ClusterWatch(link).gone()
