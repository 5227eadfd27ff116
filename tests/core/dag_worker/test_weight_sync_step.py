"""The worker's actor -> rollout weight-sync step: runs when the actor's weights changed,
hands the rollout the actor's bucket stream, and is timed in the step's metrics."""

from types import SimpleNamespace

from siirl.dag_worker.weight_sync import RolloutWeightSync


class Actor:
    weight_version = 0

    def export_weights(self, bucket_bytes):
        yield [("w", SimpleNamespace(numel=lambda: 4, element_size=lambda: 4))]


class Rollout:
    def __init__(self):
        self.loads = 0

    def load_weights(self, buckets):
        self.loads += 1
        return sum(t.numel() * t.element_size() for bucket in buckets for _, t in bucket)


class Engines(dict):
    def get(self, role):
        return self[role]


def test_syncs_only_after_the_actor_weights_changed():
    actor, rollout = Actor(), Rollout()
    sync = RolloutWeightSync(Engines(actor=actor, rollout=rollout))
    assert not sync.needed()  # both start from the loaded weights
    actor.weight_version = 1
    assert sync.needed()
    metrics = sync.run()
    assert rollout.loads == 1 and metrics["weight_sync/bytes"] == 16.0
    assert metrics["timing_s/weight_sync"] >= 0.0 and not sync.needed()


def test_nothing_to_sync_without_both_ends():
    assert not RolloutWeightSync(Engines(actor=Actor())).needed()
    assert not RolloutWeightSync(Engines(actor=object(), rollout=Rollout())).needed()
