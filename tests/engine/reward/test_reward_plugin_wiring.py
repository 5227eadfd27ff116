"""The reward managers as the DAGWorker builds them: through the plugin registry."""

from types import SimpleNamespace

import pytest
from reward_fakes import CharTokenizer, make_reward_batch

from siirl.dag_worker.walk.engine_api import RewardEngine
from siirl.dag_worker.walk.engines import WorkerEngines
from siirl.data_coordinator.protocol import get_non_tensor
from siirl.engine.reward_manager.naive import NaiveRewardManager
from siirl.params.typed import to_typed
from siirl.plugins import available, load_plugin, register, unregister


@pytest.fixture
def local_plugin():
    register("siirl.reward_managers", "naive_reward_wiring_test")(NaiveRewardManager)
    yield "naive_reward_wiring_test"
    unregister("siirl.reward_managers", "naive_reward_wiring_test")


def test_worker_engines_build_reward_manager(local_plugin):
    config = to_typed({"reward_model": {"reward_manager": local_plugin}})
    worker = SimpleNamespace()
    worker.engines = WorkerEngines(config, worker)
    worker.engines.set("actor", SimpleNamespace(tokenizer=CharTokenizer()))
    engine = worker.engines.get("reward")
    assert isinstance(engine, NaiveRewardManager) and isinstance(engine, RewardEngine)
    out = engine.compute_reward(make_reward_batch(["68"], ["arithmetic"], ["68"]))
    assert get_non_tensor(out.batch, "score") == [1.0]


@pytest.mark.parametrize("name, cls_name", [("naive", "NaiveRewardManager"),
                                            ("batch", "BatchRewardManager"),
                                            ("parallel", "ParallelRewardManager")])
def test_entry_points(name, cls_name):
    if name not in available("siirl.reward_managers"):
        pytest.skip("siirl-engine's reward entry points are not installed in this venv")
    assert load_plugin("siirl.reward_managers", name).__name__ == cls_name
