"""``free_port`` draws rendezvous ports below the kernel's ephemeral range, where no outgoing
connection can take them between the pick and the listen (EADDRINUSE with two jobs on one
machine), from the OS's randomness rather than the seeded ``random``."""

import random
import socket

from siirl.execution.scheduler import process_group_manager as pgm


def test_ports_come_from_below_the_ephemeral_range_and_can_be_listened_on(monkeypatch):
    monkeypatch.setattr(pgm, "_ephemeral_low", lambda: 32768)
    ports = set()
    for _ in range(20):
        random.seed(0)  # a training seed must not fix the draw
        port = pgm.free_port()
        assert pgm._LOWEST_PICK <= port < 32768
        with socket.socket() as sock:
            sock.bind(("", port))
            sock.listen()
        ports.add(port)
    assert len(ports) > 1


def test_a_taken_port_is_skipped(monkeypatch):
    monkeypatch.setattr(pgm, "_ephemeral_low", lambda: 32768)
    taken = other = pgm.free_port()
    while other == taken:
        other = pgm.free_port()
    with socket.socket() as held:
        held.bind(("", taken))
        draws = iter([taken, other])
        monkeypatch.setattr(random.SystemRandom, "randrange", lambda self, a, b: next(draws))
        assert pgm.free_port() == other


def test_a_range_too_narrow_to_draw_from_falls_back_to_the_kernels_pick(monkeypatch):
    monkeypatch.setattr(pgm, "_ephemeral_low", lambda: pgm._LOWEST_PICK + 10)
    with socket.socket() as sock:
        sock.bind(("", pgm.free_port()))
