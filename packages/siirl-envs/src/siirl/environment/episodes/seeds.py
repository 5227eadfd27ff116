"""Episode seeds and noise keys, the same for every kind of episode, so a rerun or a resume
replays the same episodes and every worker agrees which prompt row plays what."""

from __future__ import annotations

import zlib


def episode_seed(run_seed: int, sample_id: int, step: int) -> int:
    """A seed per (run, prompt row, step): fresh episodes every step, the same on replay
    (validation passes step -1, so every evaluation replays the same episodes)."""
    return zlib.crc32(f"{run_seed}:{sample_id}:{step}".encode())


def episode_key(sample_id: int, n: int, k: int) -> int:
    """The noise key of the ``k``-th of the ``n`` episodes of a prompt row: distinct per
    episode, so the rollout engine seeds each episode's replies apart."""
    return int(sample_id) * int(n) + int(k)
