"""tools/bench/cluster_traffic.py: its per-step figures from a run's metrics and loopback
counter marks (the two-node runs themselves: docs/cluster.md, tests/e2e/test_two_nodes.py)."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "tools/bench"
sys.path.insert(0, str(BENCH))  # the script imports bench_info as a sibling
_spec = importlib.util.spec_from_file_location("cluster_traffic", BENCH / "cluster_traffic.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_summary_means_per_step_and_loopback_between_first_and_last_step():
    records = [{"databuffer/a/bytes_sent": 10.0, "databuffer/b/bytes_sent": 30.0,
                "databuffer/a/shared_bytes": 5.0, "weight_sync/bytes": 100.0,
                "timing_s/step": 9.0, "actor/pg_loss": 0.5},
               {"databuffer/a/bytes_sent": 20.0, "databuffer/a/shared_bytes": 0.0,
                "timing_s/step": 1.0, "actor/pg_loss": 0.25},
               {"timing_s/step": 3.0, "actor/pg_loss": 0.125}]
    got = bench.summarize({"records": records, "loopback": {1: 1000, 3: 5000}}, 3)
    assert got["databuffer_bytes_sent"] == pytest.approx(20.0)  # (40 + 20 + 0) / 3
    assert got["databuffer_shared_bytes"] == pytest.approx(5.0 / 3)
    assert got["weight_sync_bytes"] == pytest.approx(100.0 / 3)
    assert got["loopback_bytes_per_step"] == 2000.0  # steps 2 and 3
    assert got["step_s"] == 2.0  # the first step (warm-up) left out
    assert got["pg_loss_last"] == 0.125
    assert bench.summarize({"records": records, "loopback": {1: 1}}, 3)[
        "loopback_bytes_per_step"] is None


@pytest.mark.skipif(not Path("/proc/net/dev").is_file(), reason="needs Linux /proc/net/dev")
def test_loopback_counter_reads_and_grows():
    import socket

    before = bench.loopback_bytes()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            peer, _ = server.accept()
            client.sendall(b"x" * 100_000)
            got = 0
            while got < 100_000:
                got += len(peer.recv(65536))
            peer.close()
    assert bench.loopback_bytes() - before >= 100_000
