"""The worker's actor -> rollout weight-sync step: runs when the actor's weights changed,
hands the rollout the actor's bucket stream, and is timed in the step's metrics."""

from types import SimpleNamespace

from siirl.dag_worker.walk.weight_sync import RolloutWeightSync


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


def test_a_rollout_without_the_policy_weights_is_synced_first():
    actor, rollout = Actor(), Rollout()
    rollout.needs_weights = True  # e.g. vLLM started from dummy weights
    sync = RolloutWeightSync(Engines(actor=actor, rollout=rollout))
    assert sync.needed()
    metrics = sync.run()
    rollout.needs_weights = False  # what a real rollout does once loaded
    assert metrics["perf/weight_sync_mb"] == 16.0 / (1 << 20) and not sync.needed()


def test_bucket_size_comes_from_the_rollout_config():
    from siirl.dag_worker.walk.weight_sync import bucket_bytes_of
    from siirl.params.typed import to_typed

    config = to_typed({"actor_rollout_ref": {"rollout": {
        "update_weights_bucket_megabytes": 8}}})
    assert bucket_bytes_of(config) == 8 << 20
    assert bucket_bytes_of(to_typed({})) == 512 << 20  # the schema's default


def test_a_model_update_frequency_syncs_every_nth_update_only():
    """ROLL's model_update_frequency=3: the rollout takes the weights of updates 3, 6, ...
    (and any time it holds none)."""
    actor, rollout = Actor(), Rollout()
    sync = RolloutWeightSync(Engines(actor=actor, rollout=rollout), frequency=3)
    synced = []
    for update in range(1, 8):
        actor.weight_version = update
        if sync.needed():
            sync.run()
            synced.append(update)
    assert synced == [3, 6] and rollout.loads == 2 and sync.synced_version == 6
    rollout.needs_weights = True  # e.g. a restarted engine: synced at once
    assert sync.needed()


def test_the_frequency_comes_from_the_rollout_config_and_needs_an_engine_rollout():
    import pytest

    from siirl.dag_worker.walk.weight_sync import update_frequency_of
    from siirl.errors import ConfigError
    from siirl.params.parser import parse_config

    config = parse_config(["actor_rollout_ref.rollout.name=vllm",
                           "actor_rollout_ref.rollout.model_update_frequency=4"])
    assert update_frequency_of(config) == 4 and update_frequency_of(parse_config([])) == 1
    with pytest.raises(ConfigError, match="model_update_frequency"):
        parse_config(["actor_rollout_ref.rollout.model_update_frequency=4"])  # hf
