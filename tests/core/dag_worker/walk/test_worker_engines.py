"""Engines: roles a graph needs, plugin lookup at init, and the per-role engine cache."""

import pytest
import torch

import siirl.plugins as plugins
from siirl.dag_worker.dagworker import DAGWorker
from siirl.dag_worker.data_structures import NodeOutput
from siirl.dag_worker.walk.engines import WorkerEngines, roles_needed
from siirl.data_coordinator.protocol import make_batch
from siirl.errors import PluginNotFoundError
from siirl.execution.dag import builtin_pipelines as bp
from siirl.execution.dag.pipeline import Pipeline
from siirl.params.typed import to_typed

ROLLOUT_CONFIG = {"actor_rollout_ref": {"rollout": {"name": "fake"}}}


@pytest.fixture
def no_entry_points(monkeypatch):
    """An empty plugin registry, whatever is installed."""
    monkeypatch.setattr(plugins, "entry_points", lambda group=None: [])


class FakeRollout:
    def __init__(self, role, config, worker):
        self.role, self.config, self.worker = role, config, worker
        self.generated = []

    def generate(self, batch, validate=False):
        self.generated.append(batch)
        out = batch.clone()
        out.set("responses", torch.ones(batch.batch_size[0], 2, dtype=torch.long))
        return NodeOutput(batch=out, metrics={"rollout/n": 1})


@pytest.fixture
def fake_rollout():
    built = []

    def factory(role, config, worker):
        engine = FakeRollout(role, config, worker)
        built.append(engine)
        return engine

    plugins.register("siirl.rollouts", "fake")(factory)
    yield built
    plugins.unregister("siirl.rollouts", "fake")


def test_roles_needed():
    assert roles_needed(bp.grpo_pipeline()) == ["rollout", "reward", "actor", "reference"]
    assert roles_needed(bp.dapo_pipeline()) == ["rollout", "reward", "actor", "reference"]
    assert set(roles_needed(bp.ppo_pipeline())) == {"rollout", "reward", "actor", "reference",
                                                    "critic"}


def test_roles_needed_ignores_custom_functions():
    graph = Pipeline("p").add_node(
        "gen", func="siirl.dag_worker.nodes.dapo_filter:dynamic_sampling",
        node_type="MODEL_INFERENCE", node_role="ROLLOUT").build()
    assert roles_needed(graph) == []


def test_init_engines_with_empty_registry_names_the_group(no_entry_points):
    worker = DAGWorker(bp.grpo_pipeline(), config={"actor_rollout_ref": {"rollout":
                                                                          {"name": "hf"}}})
    with pytest.raises(PluginNotFoundError) as info:
        worker.init_engines()
    msg = str(info.value)
    assert "siirl.rollouts" in msg and "'hf'" in msg
    assert "actor_rollout_ref.rollout.name" in msg and "pip install" in msg


def test_init_engines_without_config_names_the_key(no_entry_points):
    with pytest.raises(PluginNotFoundError, match="actor_rollout_ref.rollout.name"):
        DAGWorker(bp.grpo_pipeline()).init_engines()


def test_init_engines_on_compute_only_graph_needs_nothing(no_entry_points):
    graph = Pipeline("p").add_node("adv", node_type="COMPUTE", node_role="ADVANTAGE").build()
    DAGWorker(graph).init_engines()


def test_get_builds_registered_engine_once(fake_rollout):
    worker = DAGWorker(bp.grpo_pipeline(), config=ROLLOUT_CONFIG)
    engines = WorkerEngines(worker.config, worker=worker)
    assert "rollout" not in engines
    engine = engines.get("rollout")
    assert isinstance(engine, FakeRollout)
    assert engine.role == "rollout" and engine.config is worker.config
    assert engine.worker is worker
    assert engines.get("rollout") is engine
    assert len(fake_rollout) == 1 and "rollout" in engines


def test_builtin_generate_node_uses_the_engine(fake_rollout):
    graph = Pipeline("gen").add_node("rollout_actor", node_type="MODEL_INFERENCE",
                                     node_role="ROLLOUT").build()
    worker = DAGWorker(graph, config=ROLLOUT_CONFIG)
    worker.init_engines()
    batch = make_batch({"input_ids": torch.zeros(3, 4, dtype=torch.long)})
    result = worker.execute_task_graph(batch)
    (engine,) = fake_rollout
    assert engine.worker is worker and engine.generated == [batch]
    assert result.outputs["rollout_actor"].batch["responses"].shape == (3, 2)
    assert result.metrics["rollout/n"] == 1.0


def test_factory_without_generate_is_rejected():
    def bad_factory(role, config, worker):
        return object()

    plugins.register("siirl.rollouts", "fake")(bad_factory)
    try:
        engines = WorkerEngines(to_typed(ROLLOUT_CONFIG), worker=None)
        with pytest.raises(PluginNotFoundError) as info:
            engines.get("rollout")
        msg = str(info.value)
        assert "'fake'" in msg and "RolloutEngine" in msg and "rollout" in msg
        assert "rollout" not in engines
    finally:
        plugins.unregister("siirl.rollouts", "fake")


def test_set_installs_an_engine_directly():
    engines = WorkerEngines(to_typed(None), worker=None)
    engine = FakeRollout("rollout", None, None)
    engines.set("rollout", engine)
    assert engines.get("rollout") is engine


@pytest.mark.parametrize("config,role,expected", [
    # the reference follows the actor through the schema's interpolation
    ({"actor_rollout_ref": {"actor": {"strategy": "megatron"}}}, "reference",
     ("siirl.engines", "megatron", "actor_rollout_ref.ref.strategy")),
    ({"actor_rollout_ref": {"actor": {"strategy": "fsdp"}, "ref": {"strategy": "megatron"}}},
     "reference", ("siirl.engines", "megatron", "actor_rollout_ref.ref.strategy")),
    ({"actor_rollout_ref": {"actor": {"strategy": "megatron"}}, "critic": {"strategy": ""}},
     "critic", ("siirl.engines", "megatron", "actor_rollout_ref.actor.strategy")),
    ({"reward_model": {"reward_manager": "naive"}}, "reward",
     ("siirl.reward_managers", "naive", "reward_model.reward_manager")),
])
def test_plugin_name_and_fallbacks(config, role, expected):
    assert WorkerEngines(to_typed(config), worker=None).plugin_name(role) == expected


class FakeActor:
    tokenizer = "the actor's tokenizer"

    def compute_log_prob(self, batch):
        return NodeOutput(batch=batch)

    def update_policy(self, batch):
        return NodeOutput(batch=batch)


class PeerRollout(FakeRollout):
    peer_roles = ("actor",)  # generates with the actor's model, like the hf rollout

    def __init__(self, role, config, worker, peers):
        super().__init__(role, config, worker)
        self.actor = peers.get("actor")


def test_a_rollout_gets_the_peer_it_declares_without_an_actor_node():
    config = {"actor_rollout_ref": {"rollout": {"name": "peer"}, "actor": {"strategy": "fake"}}}
    plugins.register("siirl.rollouts", "peer")(PeerRollout)
    plugins.register("siirl.engines", "fake")(lambda role, config, worker: FakeActor())
    try:
        engines = WorkerEngines(to_typed(config), worker=None)
        engines.build(["rollout"])
        assert isinstance(engines.rollout.actor, FakeActor)
        assert engines.tokenizer() == FakeActor.tokenizer  # the dataloader's tokenizer
    finally:
        plugins.unregister("siirl.rollouts", "peer")
        plugins.unregister("siirl.engines", "fake")


def test_no_engine_with_a_tokenizer_gives_none(fake_rollout):
    engines = WorkerEngines(to_typed(ROLLOUT_CONFIG), worker=None)
    engines.build(["rollout"])
    assert engines.tokenizer() is None


def test_every_role_of_the_table_is_an_attribute_built_once_on_first_use():
    from siirl.dag_worker.walk.engine_api import ROLE_PROTOCOLS
    from siirl.dag_worker.walk.engines import BUILD_ORDER, ROLE_SOURCES

    assert set(ROLE_SOURCES) == set(BUILD_ORDER) == set(ROLE_PROTOCOLS)
    engines, built = WorkerEngines(config=None, worker=None), []
    engines._create = lambda role: built.append(role) or f"engine of {role}"
    for role in BUILD_ORDER:
        assert getattr(engines, role) == f"engine of {role}"
        assert getattr(engines, role) == f"engine of {role}" and role in engines
    assert built == list(BUILD_ORDER)  # each built once, when first asked for
    assert not hasattr(engines, "planner")
