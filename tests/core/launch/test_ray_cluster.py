"""Joining a Ray cluster: an address that does not answer, a loopback address Ray would
dial through the interface address, and a join that hangs all end in one clear error."""

import socket
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("ray")

from siirl.errors import ConfigError  # noqa: E402
from siirl.launch import cluster_link, ray_cluster  # noqa: E402


@pytest.fixture
def listening():
    """A port on 127.0.0.1 only that accepts connections."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"127.0.0.1:{server.getsockname()[1]}"


def closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize("address, want", [("127.0.0.1:6379", ("127.0.0.1", 6379)),
                                           ("ray://head:10001", ("head", 10001)),
                                           ("[::1]:6379", ("::1", 6379)),
                                           ("auto", None), ("head", None)])
def test_host_port(address, want):
    assert cluster_link.host_port(address) == want


def test_a_listening_address_is_reachable(listening):
    ray_cluster.wait_reachable(listening, 1.0)


def test_a_closed_port_fails_after_the_timeout_naming_the_address():
    address = closed_port()
    started = time.monotonic()
    with pytest.raises(ConfigError, match=rf"trainer.ray_address={address}: no Ray cluster "
                                          r"answers there within 0.5 s"):
        ray_cluster.wait_reachable(address, 0.5)
    assert 0.4 < time.monotonic() - started < 5


def test_a_loopback_only_cluster_without_node_ip_is_explained(listening, monkeypatch):
    # Ray would dial the interface address, where the loopback-bound port does not answer
    monkeypatch.setattr("ray.util.get_node_ip_address", lambda: "127.0.0.2")
    with pytest.raises(ConfigError, match="needs trainer.ray_node_ip=127.0.0.1"):
        ray_cluster.check_address(listening, None, 1.0)
    ray_cluster.check_address(listening, "127.0.0.1", 1.0)  # pinned: Ray dials it as given


def test_pinning_a_loopback_node_ip_keeps_ray_on_the_loopback(monkeypatch):
    from ray._private import ray_constants, services

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    assert ray_cluster.pin_node_ip(None) == {}
    assert ray_cluster.pin_node_ip("10.1.2.3") == {"_node_ip_address": "10.1.2.3"}
    assert ray_constants.ENABLE_RAY_CLUSTER  # a routable address: nothing to keep
    assert ray_cluster.pin_node_ip("127.0.0.1") == {"_node_ip_address": "127.0.0.1"}
    assert services.resolve_ip_for_localhost("127.0.0.1").startswith("127.")


def test_a_hanging_join_ends_the_process_with_one_line(listening):
    code = textwrap.dedent(f"""
        import time, ray
        from siirl.launch import ray_cluster
        ray.init = lambda **kw: time.sleep(600)  # a join that never finishes
        from siirl.params.typed import to_typed
        config = to_typed({{"trainer": {{"ray_address": "{listening}",
                                        "ray_node_ip": "127.0.0.1",
                                        "ray_connect_timeout_s": 1.0}}}})
        ray_cluster.start_ray(config, 2)
    """)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert time.monotonic() - started < 30
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"siirl-train: error: trainer.ray_address={listening}: joining the Ray cluster did "
        "not finish within 1 s")
