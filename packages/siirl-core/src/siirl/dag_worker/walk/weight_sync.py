"""The actor -> rollout weight sync, a step of its own in the worker loop.

Whenever the actor's weights changed (an update, a checkpoint load: its ``weight_version``
moved) the rollout engine is handed the actor's weights as a stream of named-tensor
buckets (``actor.export_weights(bucket_bytes)`` -> ``rollout.load_weights(buckets)``).
The worker runs it before each node and after the last one, so the rollout never
generates with stale weights, and times it as ``timing_s/weight_sync`` (bytes moved:
``weight_sync/bytes`` and ``perf/weight_sync_mb``; 0 when the rollout generates with the
actor's own tensors). Buckets hold ``rollout.update_weights_bucket_megabytes``. A rollout
that starts without the policy's weights (``needs_weights``, e.g. vLLM's dummy load
format) is synced before it first generates.
"""

from __future__ import annotations

import time
from typing import Any, Dict

BUCKET_BYTES = 64 << 20


def bucket_bytes_of(config: Any) -> int:
    """``rollout.update_weights_bucket_megabytes`` in bytes (``BUCKET_BYTES`` when 0)."""
    megabytes = config.actor_rollout_ref.rollout.update_weights_bucket_megabytes
    return int(megabytes) << 20 if megabytes else BUCKET_BYTES


def update_frequency_of(config: Any) -> int:
    """``rollout.model_update_frequency`` (at least 1)."""
    return max(1, int(config.actor_rollout_ref.rollout.model_update_frequency or 1))


class RolloutWeightSync:
    """``frequency``: ROLL's model update frequency, the rollout takes the actor's weights
    when the actor's update count is a multiple of it (and whenever it holds none)."""

    def __init__(self, engines: Any, bucket_bytes: int = BUCKET_BYTES, frequency: int = 1):
        self.engines = engines
        self.bucket_bytes = bucket_bytes
        self.frequency = max(1, int(frequency))
        self.synced_version = 0  # engines start from the same loaded weights

    def _pair(self):
        if "actor" not in self.engines or "rollout" not in self.engines:
            return None
        actor, rollout = self.engines.get("actor"), self.engines.get("rollout")
        if not (hasattr(actor, "export_weights") and hasattr(rollout, "load_weights")):
            return None  # a plugin pair that shares weights some other way
        return actor, rollout

    def needed(self) -> bool:
        pair = self._pair()
        if pair is None:
            return False
        version = getattr(pair[0], "weight_version", 0)
        return (getattr(pair[1], "needs_weights", False)
                or (version != self.synced_version and version % self.frequency == 0))

    def run(self) -> Dict[str, float]:
        """Sync now; the step's metrics."""
        actor, rollout = self._pair()
        start = time.perf_counter()
        moved = rollout.load_weights(actor.export_weights(self.bucket_bytes))
        self.synced_version = actor.weight_version
        return {"timing_s/weight_sync": time.perf_counter() - start,
                "weight_sync/bytes": float(moved or 0),
                "perf/weight_sync_mb": float(moved or 0) / (1 << 20)}
