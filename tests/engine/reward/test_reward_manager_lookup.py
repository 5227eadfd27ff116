"""Finding and building a reward manager: the registry and the package's lazy exports,
loading a reward file, and what the managers are built with and tell their worker
processes to run.

Everything runs in this process (function objects, no worker processes), so it is fast.
Each test states a behaviour that mutation testing (``nox -s mutmut -- reward``) found
no test for; docs/mutation.md lists the mutants they kill and the ones that change
nothing observable.
"""

import importlib
import sys
import types

import pytest
from reward_fakes import CharTokenizer

from siirl.engine.reward_manager.batch import BatchRewardManager
from siirl.engine.reward_manager.loader import load_custom_function
from siirl.engine.reward_manager.naive import NaiveRewardManager
from siirl.engine.reward_manager.registry import GROUP, get_reward_manager_cls, register
from siirl.errors import ConfigError, PluginNotFoundError
from siirl.plugins import unregister

# ---- registry, lazy exports, loading a reward file -------------------------------------------

def test_a_name_is_registered_once_and_lookups_of_unknown_names_list_the_known_ones():
    class Mine:
        pass

    class Other:
        pass

    try:
        assert register("test_only_mine")(Mine) is Mine
        assert register("test_only_mine")(Mine) is Mine  # the same class again: fine
        with pytest.raises(PluginNotFoundError, match="'test_only_mine' is already registered"):
            register("test_only_mine")(Other)
        assert get_reward_manager_cls("test_only_mine") is Mine
    finally:
        unregister(GROUP, "test_only_mine")
    # the names are the plugin group's: siirl-engine's entry points
    with pytest.raises(PluginNotFoundError, match=r"no plugin named 'nope' in group "
                       r"'siirl.reward_managers' \(asked for by reward_model.reward_manager\); "
                       r"installed: batch, dapo, embodied, naive, parallel"):
        get_reward_manager_cls("nope")
    assert get_reward_manager_cls("naive") is NaiveRewardManager


def test_the_package_exports_resolve_lazily_and_unknown_names_raise():
    package = importlib.import_module("siirl.engine.reward_manager")
    assert package.BatchRewardManager is BatchRewardManager
    assert package.load_custom_function is load_custom_function
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        package.Nope  # noqa: B018


def test_a_reward_file_is_loaded_once_per_path(tmp_path):
    path = tmp_path / "r.py"
    path.write_text("COUNT = []\nCOUNT.append(1)\n"
                    "def compute_score(**kw):\n    return 1.0\n"
                    "def helper():\n    return 2\n")
    fn = load_custom_function(str(path))
    again = load_custom_function(str(path), "compute_score")
    assert fn is again and fn.__module__ in sys.modules
    assert sys.modules[fn.__module__].COUNT == [1]
    other = tmp_path / "sub"
    other.mkdir()
    (other / "r.py").write_text("def compute_score(**kw):\n    return 2.0\n")
    assert load_custom_function(str(other / "r.py"))() == 2.0  # same file name, own module


def test_a_missing_function_lists_the_public_functions_of_the_file(tmp_path):
    path = tmp_path / "r2.py"
    path.write_text("import os\nfrom math import floor\nVALUE = 3\n"
                    "def score_a(**kw):\n    return 1.0\n"
                    "def _private():\n    pass\n"
                    "class Scorer:\n    pass\n")
    with pytest.raises(ConfigError) as info:
        load_custom_function(str(path), "compute_score")
    assert "; it defines Scorer, score_a" in str(info.value)
    with pytest.raises(ConfigError, match=r"'VALUE' is not a function"):
        load_custom_function(str(path), "VALUE")


def test_a_file_that_fails_to_import_can_be_fixed_and_loaded_again(tmp_path):
    path = tmp_path / "r3.py"
    path.write_text("raise SystemExit(2)\n")
    with pytest.raises(ConfigError, match="failed to import.*SystemExit"):
        load_custom_function(str(path))
    path.write_text("def compute_score(**kw):\n    return 3.0\n")
    assert load_custom_function(str(path))() == 3.0


def test_a_path_that_is_no_python_module_is_refused(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("not python")
    with pytest.raises(ConfigError):
        load_custom_function(str(path))


def test_the_parallel_manager_runs_up_to_four_workers_by_default(monkeypatch):
    from siirl.engine.reward_manager import parallel

    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 16)
    assert parallel.ParallelRewardManager(config={}, tokenizer=CharTokenizer()).num_workers == 4
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 2)
    assert parallel.ParallelRewardManager(config={}, tokenizer=CharTokenizer()).num_workers == 2
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: None)
    assert parallel.ParallelRewardManager(config={}, tokenizer=CharTokenizer()).num_workers == 1
    manager = parallel.ParallelRewardManager(config={}, tokenizer=CharTokenizer(),
                                             num_workers=3, role="judge")
    assert manager.num_workers == 3 and manager.role == "judge"


# ---- what the managers are built with and tell their workers to run ------------------------


def test_what_the_worker_processes_are_told_to_run():
    from siirl.engine.reward_manager.worker_main import _resolve
    from siirl.engine.reward_score import default_compute_score

    default = NaiveRewardManager(config={}, tokenizer=CharTokenizer())
    assert _resolve(default.worker_target()) == (default_compute_score, {})

    def fn(**kwargs):
        return 1.0

    mine = NaiveRewardManager(config={}, tokenizer=CharTokenizer(), compute_score=fn,
                              reward_kwargs={"k": 1})
    assert _resolve(mine.worker_target()) == (fn, {"k": 1})


def test_the_parallel_manager_passes_its_settings_on():
    from siirl.engine.reward_manager.parallel import ParallelRewardManager

    worker = object()
    actor = types.SimpleNamespace(tokenizer=CharTokenizer())
    manager = ParallelRewardManager(config={"reward_model": {"step_timeout_s": 7}},
                                    worker=worker, peers={"actor": actor}, num_workers=1,
                                    timeout_s=2.0)
    assert manager.role == "reward" and manager.worker is worker
    assert manager.step_timeout_s == 7.0 and manager.timeout_s == 2.0
    assert manager.tokenizer is actor.tokenizer


def test_a_builtin_manager_not_imported_yet_is_imported_on_first_lookup(monkeypatch):
    package = importlib.import_module("siirl.engine.reward_manager")
    module = importlib.import_module("siirl.engine.reward_manager.parallel")
    monkeypatch.setattr(package, "parallel", module)  # put back afterwards, like the rest
    monkeypatch.delitem(sys.modules, "siirl.engine.reward_manager.parallel")
    cls = get_reward_manager_cls("parallel")
    assert cls.__name__ == "ParallelRewardManager" and cls.name == "parallel"
