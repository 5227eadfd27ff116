"""verl's ``reward_manager.source=importlib``: the user's reward manager class, loaded from
``reward_manager.module.path`` and registered like an installed one, is what the worker
builds for the reward role."""

import sys
import textwrap
from types import SimpleNamespace

import pytest
from reward_fakes import CharTokenizer, make_reward_batch

from siirl.dag_worker.walk.engine_api import RewardEngine
from siirl.dag_worker.walk.engines import WorkerEngines
from siirl.data_coordinator.protocol import get_non_tensor
from siirl.errors import ConfigError
from siirl.launch.inputs import missing_inputs
from siirl.params.parser import parse_config
from siirl.plugins import unregister

# A manager as a user writes it: this release's base class, its own scoring rule (a wrong
# answer costs -1, which no built-in manager gives), and a keyword of its own.
USER_MANAGER = textwrap.dedent("""
    from siirl.engine.reward_manager import RewardManagerBase
    from siirl.engine.reward_manager.outcome import Scored


    class ExactMatchRewardManager(RewardManagerBase):
        name = "exact_match"

        def _score_rows(self, rows, deadline):
            return [Scored(1.0 if solution.strip() == str(truth) else -1.0,
                           {"matched": solution.strip() == str(truth)})
                    for _, solution, truth, _ in rows]
""")
# verl's shape: an AbstractRewardManager called on a DataProto
VERL_MANAGER = textwrap.dedent("""
    class VerlStyleRewardManager:
        def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="x"):
            self.tokenizer = tokenizer

        def __call__(self, data, return_dict=False):
            return None
""")


@pytest.fixture
def manager_file(tmp_path):
    path = tmp_path / "my_reward_manager.py"
    path.write_text(USER_MANAGER)
    yield path
    unregister("siirl.reward_managers", "ExactMatchRewardManager")


def _importlib(path, *more, name="ExactMatchRewardManager"):
    return ["reward_manager.source=importlib", f"reward_manager.name={name}",
            f"reward_manager.module.path={path}", *more]


def _reward_engine(config):
    worker = SimpleNamespace()
    worker.engines = WorkerEngines(config, worker)
    worker.engines.set("actor", SimpleNamespace(tokenizer=CharTokenizer()))
    return worker.engines.get("reward")


def test_the_users_class_is_the_reward_manager_the_worker_builds(manager_file, capsys):
    config = parse_config(_importlib(manager_file, "reward_manager.module.name=my_rm_mod"),
                          validate=True)
    assert "reward_manager" not in capsys.readouterr().err  # every key read: no notice
    assert config.reward_model.reward_manager == "ExactMatchRewardManager"
    engine = _reward_engine(config)
    assert type(engine).__name__ == "ExactMatchRewardManager" and isinstance(engine,
                                                                              RewardEngine)
    out = engine.compute_reward(make_reward_batch(["68", "5"], ["arithmetic"] * 2,
                                                  ["68", "6"]))
    assert get_non_tensor(out.batch, "score") == [1.0, -1.0]
    assert get_non_tensor(out.batch, "matched") == [True, False]
    # module.name: the file's module is importable by that name; a second worker in the
    # process gets the same class (one registration)
    assert sys.modules["my_rm_mod"].__file__ == str(manager_file)
    assert type(_reward_engine(config)) is type(engine)
    sys.modules.pop("my_rm_mod")


def test_a_file_url_and_a_pkg_module_load_too(manager_file):
    config = parse_config(_importlib(f"file://{manager_file}", "reward_manager.module.name=null"))
    assert type(_reward_engine(config)).__name__ == "ExactMatchRewardManager"
    config = parse_config(_importlib("pkg://siirl.engine.reward_manager.naive",
                                     name="DAPORewardManager"))
    try:
        assert type(_reward_engine(config)).__name__ == "DAPORewardManager"
    finally:
        unregister("siirl.reward_managers", "DAPORewardManager")


def test_reward_manager_name_with_register_picks_an_installed_manager():
    config = parse_config(["reward_manager.name=batch"])
    assert config.reward_model.reward_manager == "batch"
    assert type(_reward_engine(config)).__name__ == "BatchRewardManager"


@pytest.mark.parametrize("source,name,words", [
    (VERL_MANAGER, "VerlStyleRewardManager", ["no compute_reward", "DataProto",
                                              "RewardManagerBase"]),
    ("from verl import DataProto\n", "X", ["failed to import", "verl", "RewardManagerBase"]),
    (USER_MANAGER, "Missing", ["defines no class 'Missing' (reward_manager.name)",
                               "it defines ExactMatchRewardManager"]),
])
def test_a_class_that_cannot_serve_is_refused_naming_why(tmp_path, source, name, words):
    path = tmp_path / f"bad_{name}.py"
    path.write_text(source)
    config = parse_config(_importlib(path, "reward_manager.module.name=null", name=name))
    with pytest.raises(ConfigError) as info:
        _reward_engine(config)
    assert all(word in str(info.value) for word in words), str(info.value)


def test_a_module_name_taken_by_another_module_is_refused(manager_file):
    config = parse_config(_importlib(manager_file, "reward_manager.module.name=json"))
    with pytest.raises(ConfigError, match="reward_manager.module.name='json' is already"):
        _reward_engine(config)


def test_a_missing_file_is_named_before_anything_loads(tmp_path):
    config = parse_config(_importlib(tmp_path / "nowhere.py"))
    assert missing_inputs(config) == [f"reward_manager.module.path={tmp_path / 'nowhere.py'}"]
    assert missing_inputs(parse_config(_importlib("pkg://siirl.engine.reward_manager.naive")
                                       )) == []
