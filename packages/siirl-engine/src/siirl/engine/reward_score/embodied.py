"""Embodied rewards: task success, and SRPO's progress reward for failed episodes.

SRPO (self-referential policy optimization) scores a failed episode by how close its video
embedding lies to the successful episodes of the same task in the same batch: the success
embeddings are standardized and clustered (DBSCAN, eps 0.5, at least 2 points; no cluster:
their mean), each failure's distance to the nearest cluster centre is min-max normalized
over the task's failures (all equal: 0.5), and the reward is
``failure_scale * sigmoid(steepness * (offset - normalized distance))`` (0.6, 10, 0.5 as
in siiRL), so nearer failures earn more, never as much as a success (1.0). A task with no
success or no failure in the batch leaves its failures at 0.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np


def dbscan(points: np.ndarray, eps: float = 0.5, min_samples: int = 2) -> np.ndarray:
    """Cluster labels (0, 1, ...; -1 for noise) of ``points`` [N, D], Euclidean."""
    count = len(points)
    distances = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)
    neighbours = [np.flatnonzero(row <= eps) for row in distances]
    core = np.array([len(n) >= min_samples for n in neighbours], dtype=bool)
    labels = np.full(count, -1)
    cluster = 0
    for start in range(count):
        if not core[start] or labels[start] != -1:
            continue
        labels[start] = cluster
        frontier = list(neighbours[start])
        while frontier:
            point = frontier.pop()
            if labels[point] == -1:
                labels[point] = cluster
                if core[point]:
                    frontier.extend(neighbours[point])
        cluster += 1
    return labels


def success_centres(embeddings: np.ndarray, eps: float = 0.5,
                    min_samples: int = 2) -> np.ndarray:
    """Centres of the successful episodes' clusters, in the original embedding space."""
    mean = embeddings.mean(axis=0)
    std = embeddings.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    labels = dbscan((embeddings - mean) / std, eps, min_samples)
    centres = [embeddings[labels == label].mean(axis=0) for label in sorted(set(labels))
               if label != -1]
    return np.stack(centres) if centres else embeddings.mean(axis=0, keepdims=True)


def progress_rewards(embeddings: np.ndarray, success: Sequence[bool], groups: Sequence[str],
                     failure_scale: float = 0.6, steepness: float = 10.0,
                     offset: float = 0.5) -> Tuple[np.ndarray, Dict[int, float]]:
    """(reward per episode, normalized distance of each scored failure by row)."""
    success = np.asarray(success, dtype=bool)
    embeddings = np.asarray(embeddings, dtype=np.float64)
    rewards = np.where(success, 1.0, 0.0)
    normalized: Dict[int, float] = {}
    usable = ~np.all(embeddings == 0, axis=1)  # an all-zero embedding was never computed
    by_group: Dict[str, List[int]] = {}
    for row, group in enumerate(groups):
        if usable[row]:
            by_group.setdefault(str(group), []).append(row)
    for rows in by_group.values():
        rows = np.asarray(rows)
        wins, losses = rows[success[rows]], rows[~success[rows]]
        if len(wins) == 0 or len(losses) == 0:
            continue
        centres = success_centres(embeddings[wins])
        nearest = np.linalg.norm(embeddings[losses][:, None, :] - centres[None, :, :],
                                 axis=-1).min(axis=1)
        spread = nearest.max() - nearest.min()
        scaled = np.full_like(nearest, 0.5) if spread < 1e-6 else \
            (nearest - nearest.min()) / spread
        rewards[losses] = failure_scale / (1.0 + np.exp(-steepness * (offset - scaled)))
        normalized.update({int(r): float(v) for r, v in zip(losses, scaled, strict=True)})
    return rewards, normalized
