"""Embodied rewards: task success, and SRPO's progress reward for failed episodes.

SRPO (self-referential policy optimization) scores a failed episode by how close its video
embedding lies to the successful episodes of the same task in the same batch: the success
embeddings are standardized and clustered (DBSCAN, eps 0.5, at least 2 points; no cluster:
their mean), each failure's distance to the nearest cluster centre is min-max normalized
over the task's failures (all equal: 0.5), and the reward is
``failure_scale * sigmoid(steepness * (offset - normalized distance))`` (0.6, 10, 0.5 as
in siiRL), so nearer failures earn more, never as much as a success (1.0). A task with no
success or no failure in the batch leaves its failures at 0.

"The batch" is the global batch: with its rows on several workers, each worker's
successful embeddings per task and its failures' distance range per task go to every
worker (``core_algos.batch_reduction``), so N workers score like one. The successes are
clustered in a canonical order (sorted by embedding), which DBSCAN's border points depend
on, so that no worker split changes the clusters.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from siirl.dag_worker.core_algos.batch_reduction import LOCAL


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
    """Centres of the successful episodes' clusters, in the original embedding space; the
    same for any order of ``embeddings`` (clustered sorted)."""
    embeddings = embeddings[np.lexsort(embeddings.T[::-1])]
    mean = embeddings.mean(axis=0)
    std = embeddings.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    labels = dbscan((embeddings - mean) / std, eps, min_samples)
    centres = [embeddings[labels == label].mean(axis=0) for label in sorted(set(labels))
               if label != -1]
    return np.stack(centres) if centres else embeddings.mean(axis=0, keepdims=True)


def _merged(parts: Sequence[Dict[str, Any]], combine: Any) -> Dict[str, Any]:
    """One dict of the workers' dicts (rank order), values of a key combined."""
    merged: Dict[str, List[Any]] = {}
    for part in parts:
        for key, value in part.items():
            merged.setdefault(key, []).append(value)
    return {key: combine(values) for key, values in merged.items()}


def progress_rewards(embeddings: np.ndarray, success: Sequence[bool], groups: Sequence[str],
                     failure_scale: float = 0.6, steepness: float = 10.0,
                     offset: float = 0.5, reduction: Any = LOCAL
                     ) -> Tuple[np.ndarray, Dict[int, float]]:
    """(reward per episode of these rows, normalized distance of each scored failure by
    row). ``reduction`` spans the workers holding the rest of the batch (``LOCAL``: these
    rows are all of it); every one of them must call this, rows or not."""
    success = np.asarray(success, dtype=bool)
    embeddings = np.asarray(embeddings, dtype=np.float64)
    rewards = np.where(success, 1.0, 0.0)
    normalized: Dict[int, float] = {}
    usable = ~np.all(embeddings == 0, axis=1)  # an all-zero embedding was never computed
    by_group: Dict[str, List[int]] = {}
    for row, group in enumerate(groups):
        if usable[row]:
            by_group.setdefault(str(group), []).append(row)
    rows_of = {group: np.asarray(rows) for group, rows in by_group.items()}
    # every worker's successes of each task
    wins = {group: embeddings[rows[success[rows]]] for group, rows in rows_of.items()
            if success[rows].any()}
    wins = _merged(reduction.gather(wins), np.concatenate)
    centres = {group: success_centres(points) for group, points in wins.items()}
    nearest: Dict[str, np.ndarray] = {}
    for group, rows in rows_of.items():
        losses = rows[~success[rows]]
        if group in centres and len(losses):
            nearest[group] = np.linalg.norm(
                embeddings[losses][:, None, :] - centres[group][None, :, :], axis=-1).min(axis=1)
    # the range of each task's failure distances over every worker
    ranges = _merged(reduction.gather({group: (float(d.min()), float(d.max()))
                                       for group, d in nearest.items()}),
                     lambda spans: (min(lo for lo, _ in spans), max(hi for _, hi in spans)))
    for group, distances in nearest.items():
        low, high = ranges[group]
        spread = high - low
        scaled = np.full_like(distances, 0.5) if spread < 1e-6 else (distances - low) / spread
        losses = rows_of[group][~success[rows_of[group]]]
        rewards[losses] = failure_scale / (1.0 + np.exp(-steepness * (offset - scaled)))
        normalized.update({int(r): float(v) for r, v in zip(losses, scaled, strict=True)})
    return rewards, normalized
