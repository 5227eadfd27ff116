"""Reward-manager behaviour that mutation testing (``nox -s mutmut -- reward``) found no test
for: the batch manager with a function object (its calls, the halving search, the step
budget), result checking, extra columns, failure bookkeeping, the overlong penalty, the
registry and the package's lazy exports, and loading a reward file.

Everything runs in this process (function objects, no worker processes), so it is fast.
Each test states a behaviour; docs/mutation.md lists the mutants they kill and the ones
that change nothing observable.
"""

import importlib
import logging
import math
import sys
import types

import numpy as np
import pytest
import torch
from reward_fakes import CharTokenizer, make_reward_batch

from siirl.data_coordinator.protocol import get_non_tensor
from siirl.engine.reward_manager.batch import BatchRewardManager
from siirl.engine.reward_manager.columns import extra_columns, score_metrics, token_level
from siirl.engine.reward_manager.failures import FailureLog
from siirl.engine.reward_manager.loader import load_custom_function
from siirl.engine.reward_manager.naive import NaiveRewardManager
from siirl.engine.reward_manager.outcome import Failure, Scored, call_batch, check_result
from siirl.engine.reward_manager.overlong import overlong_penalty
from siirl.engine.reward_manager.registry import GROUP, get_reward_manager_cls, register
from siirl.errors import ConfigError, PluginNotFoundError
from siirl.plugins import unregister

ROWS = [("s", "a", "1", None), ("s", "bb", "2", {"k": 1}), ("t", "ccc", "3", None)]


# ---- one call of a batch function ------------------------------------------------------------

def test_call_batch_passes_the_columns_and_the_kwargs():
    seen = []

    def fn(data_sources, solution_strs, ground_truths, extra_infos, bonus=0.0):
        seen.append((data_sources, solution_strs, ground_truths, extra_infos, bonus))
        return [len(s) + bonus for s in solution_strs]

    out = call_batch(fn, ROWS, {"bonus": 0.5})
    assert out == [Scored(1.5), Scored(2.5), Scored(3.5)]
    assert seen == [(["s", "s", "t"], ["a", "bb", "ccc"], ["1", "2", "3"],
                     [None, {"k": 1}, None], 0.5)]


def test_call_batch_on_no_rows_passes_four_empty_columns():
    def fn(*columns):
        assert columns == ([], [], [], [])
        return []

    assert call_batch(fn, [], {}) == []


def test_call_batch_failures_and_bad_results():
    def raises(*columns):
        raise ValueError("bad input")

    def exits(*columns):
        sys.exit(3)

    assert call_batch(raises, ROWS, {}) == Failure("exception", "ValueError: bad input")
    assert call_batch(exits, ROWS, {}) == Failure("exit", "the function called sys.exit(3)")
    assert call_batch(lambda *c: 7, ROWS, {}) == ("bad_result",
                                                  "returned int, expected a list")
    assert call_batch(lambda *c: [1.0], ROWS, {}) == ("bad_result",
                                                      "returned 1 results for 3 rows")
    assert call_batch(lambda *c: (x for x in [1, "x", math.nan]), ROWS, {}) == [
        Scored(1.0), Failure("non_numeric", "returned 'x' (str), not a number or a dict "
                                            "with a numeric 'score'"),
        Failure("non_finite", "returned nan: not finite")]


def test_call_batch_lets_a_config_error_through():
    def fn(*columns):
        raise ConfigError("no rule for data_source")

    with pytest.raises(ConfigError):
        call_batch(fn, ROWS, {})


# ---- the batch manager with a function object ------------------------------------------------

def batch_manager(fn, **kwargs):
    return BatchRewardManager(config=kwargs.pop("config", {}), tokenizer=CharTokenizer(),
                              compute_score=fn, **kwargs)


def test_batch_manager_scores_in_one_call_with_reward_kwargs():
    calls = []

    def fn(data_sources, solution_strs, ground_truths, extra_infos, scale=1.0):
        calls.append(list(solution_strs))
        return [{"score": scale * float(s == g), "acc": s == g}
                for s, g in zip(solution_strs, ground_truths, strict=True)]

    batch = make_reward_batch(["7", "8", "9"], ["x"] * 3, ["7", "0", "9"])
    out = batch_manager(fn, reward_kwargs={"scale": 2.0}).compute_reward(batch)
    assert calls == [["7", "8", "9"]]
    assert get_non_tensor(out.batch, "score") == [2.0, 0.0, 2.0]
    assert get_non_tensor(out.batch, "acc") == [True, False, True]
    assert out.metrics["reward/retried"] == 0.0


def test_a_failed_batch_call_is_halved_until_the_bad_sample_stands_alone(caplog):
    calls = []

    def fn(data_sources, solution_strs, ground_truths, extra_infos):
        calls.append(list(solution_strs))
        if "bad" in solution_strs:
            raise RuntimeError("cannot score 'bad'")
        return [1.0] * len(solution_strs)

    batch = make_reward_batch(["a", "b", "bad", "c"], ["x"] * 4, ["1"] * 4)
    with caplog.at_level(logging.WARNING):
        out = batch_manager(fn).compute_reward(batch)
    assert get_non_tensor(out.batch, "score") == [1.0, 1.0, 0.0, 1.0]
    assert calls == [["a", "b", "bad", "c"], ["a", "b"], ["bad", "c"], ["bad"], ["c"]]
    assert out.metrics["reward/retried"] == 3.0  # a, b and c scored again
    assert out.metrics["reward/errors/exception"] == 1.0
    retry = [r for r in caplog.records if "scored again in smaller calls" in r.getMessage()]
    assert len(retry) == 1 and "a call on 4 samples failed" in retry[0].getMessage()


def test_a_batch_function_returning_no_list_is_a_config_error():
    batch = make_reward_batch(["a"], ["x"], ["1"])
    with pytest.raises(ConfigError, match=r"batch reward function .*returned int"):
        batch_manager(lambda *columns: 3).compute_reward(batch)


def test_when_the_step_budget_is_spent_unscored_samples_fail_as_timeouts():
    manager = batch_manager(lambda *columns: [1.0] * len(columns[0]))
    calls = []

    def scores(part, deadline):
        calls.append(len(part))
        return [Scored(1.0)] * len(part)

    out = manager.isolate(scores, list(ROWS), deadline=0.0)  # long past
    assert calls == [] and [o.kind for o in out] == ["timeout"] * 3
    assert "before this sample was scored" in out[0].reason


def test_samples_of_a_failed_call_left_when_time_ran_out_keep_its_failure(monkeypatch):
    import types

    import siirl.engine.reward_manager.batch as batch_module

    clock = {"now": 0.0}
    monkeypatch.setattr(batch_module, "time", types.SimpleNamespace(monotonic=lambda: clock["now"]))

    def fails(part, deadline):
        clock["now"] = 10.0  # the call used up the step's time
        return Failure("crash", "worker died")

    manager = batch_manager(lambda *columns: [1.0] * len(columns[0]))
    out = manager.isolate(fails, list(ROWS), deadline=5.0)
    assert [o.kind for o in out] == ["crash"] * 3
    assert "worker died (in a call on several samples;" in out[0].reason
    assert "step_timeout_s" in out[0].reason


def test_close_stops_a_pool_that_was_started():
    class Pool:
        closed = 0

        def close(self):
            Pool.closed += 1

    manager = NaiveRewardManager(config={}, tokenizer=CharTokenizer())
    manager.close()  # no pool: nothing to stop
    manager._pool = Pool()
    manager.close()
    assert Pool.closed == 1


# ---- checking one result ---------------------------------------------------------------------

@pytest.mark.parametrize("value, score", [
    (True, 1.0), (3, 3.0), (np.float32(0.5), 0.5), (torch.tensor([2.0]), 2.0),
    (np.array([[4.0]]), 4.0), (-1e9, -1e9),
])
def test_numbers_of_every_kind_are_scores(value, score):
    assert check_result(value) == Scored(score)


@pytest.mark.parametrize("value, kind", [
    (torch.tensor([1.0, 2.0]), "non_numeric"), ("1.0", "non_numeric"), (None, "non_numeric"),
    (np.array(["a"]), "non_numeric"),
    (math.inf, "non_finite"), (1e9 + 1, "non_finite"), (-2e9, "non_finite"),
])
def test_what_is_no_real_bounded_number_fails(value, kind):
    assert check_result(value).kind == kind


def test_a_dict_result_keeps_its_other_keys_and_needs_a_score():
    assert check_result({"score": 1, "acc": True}) == Scored(1.0, {"acc": True})
    failure = check_result({"acc": True, "pred": "x"})
    assert failure.kind == "non_numeric" and "(keys: acc, pred)" in failure.reason
    assert "(keys: none)" in check_result({}).reason


def test_a_long_bad_value_is_shortened_to_80_characters():
    reason = check_result("x" * 200).reason
    shown = reason[len("returned "):reason.index(" (str)")]
    assert len(shown) == 80 and shown.endswith("...") and shown.startswith("'xxx")
    exact = "y" * 78  # its repr is 80 characters: shown whole
    assert f"returned {exact!r} (str)" in check_result(exact).reason


# ---- columns, metrics, failures --------------------------------------------------------------

def test_missing_extra_keys_get_the_false_value_of_their_type_or_none():
    extras = [{"acc": True, "n": 3, "f": 0.5, "pred": "x"}, {}]
    columns = extra_columns(extras, reserved={"score"})
    assert columns == {"acc": [True, False], "n": [3, 0], "f": [0.5, 0.0], "pred": ["x", None]}


def test_extra_keys_naming_batch_fields_are_dropped_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        assert extra_columns([{"score": 2.0, "acc": 1}], reserved={"score"}) == {"acc": [1]}
    assert "'score' names an existing batch field" in caplog.text


def test_token_level_puts_each_reward_on_the_last_valid_token():
    responses = torch.ones(3, 4, dtype=torch.long)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    out = token_level([1.0, 2.0, 3.0], responses, mask)
    assert out.tolist() == [[0, 1.0, 0, 0], [0, 0, 0, 2.0], [0, 0, 0, 3.0]]
    assert token_level([], torch.zeros(0, 4), torch.zeros(0, 4)).shape == (0, 4)


def test_score_metrics_per_data_source():
    metrics = score_metrics([1.0, 0.0, 0.5], torch.tensor([[1.0, 0], [0, 0], [0, 0.5]]),
                            ["a", "b", "a"])
    assert metrics["reward/a/mean"] == 0.75 and metrics["reward/b/mean"] == 0.0
    assert metrics["critic/rewards/mean"] == 0.5 and score_metrics([], None, []) == {}


def test_one_warning_per_failure_kind_and_per_retry_kind(caplog):
    log = FailureLog("fn")
    with caplog.at_level(logging.WARNING):
        scores, _, counts = log.split([Failure("exception", "e1"), Scored(1.0),
                                       Failure("exception", "e2"), Failure("timeout", "t")],
                                      ["a", "b", "c", "d"])
        log.warn_retry(Failure("exception", "r1"), 4)
        log.warn_retry(Failure("exception", "r2"), 2)
        log.warn_retry(Failure("crash", "r3"), 2)
    assert scores == [0.0, 1.0, 0.0, 0.0] and counts["exception"] == 2
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 4
    assert sum("smaller calls" in m for m in messages) == 2
    assert log.last == (3, "d", Failure("timeout", "t"))


def test_the_error_that_stops_a_run_names_the_last_failure():
    log = FailureLog("'score' in r.py")
    assert "The last error was none recorded." in str(log.failed_steps_error(3))
    log.split([Failure("exit", "sys.exit(1)")], ["gsm8k"])
    text = str(log.failed_steps_error(3))
    assert "'score' in r.py" in text and "max_failed_steps=3" in text
    assert "sample 0 (data_source 'gsm8k'): exit: sys.exit(1)" in text
    manager = NaiveRewardManager(config={}, tokenizer=CharTokenizer())
    assert "max_failed_steps=5" in str(manager.failed_steps_error(5))


# ---- overlong penalty ------------------------------------------------------------------------

def overlong_config(length=4, factor=1.0, max_len=10):
    return {"data": {"max_response_length": max_len},
            "reward_model": {"overlong_buffer": {"enable": True, "len": length,
                                                 "penalty_factor": factor}}}


def test_overlong_penalty_is_linear_in_the_buffer_and_zero_before_it():
    lengths = torch.tensor([5, 6, 7, 8, 10])
    penalty = overlong_penalty(lengths, overlong_config(length=4, factor=2.0, max_len=10))
    assert penalty.tolist() == [0.0, 0.0, -0.5, -1.0, -2.0]
    assert overlong_penalty(lengths, {}) is None


@pytest.mark.parametrize("length", [0, 11])
def test_an_overlong_buffer_outside_the_response_length_is_refused(length):
    with pytest.raises(ConfigError, match="must be in 1..data.max_response_length"):
        overlong_penalty(torch.tensor([1]), overlong_config(length=length))


def test_the_whole_response_may_be_the_buffer():
    assert overlong_penalty(torch.tensor([0, 10]), overlong_config(length=10)).tolist() == \
        [0.0, -1.0]


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


# ---- per-row calls of a function object, in this process -------------------------------------

def test_a_function_object_gets_every_field_and_the_kwargs_and_its_failures_are_counted():
    seen = []

    def fn(data_source, solution_str, ground_truth, extra_info, bonus=0.0):
        seen.append((data_source, solution_str, ground_truth, extra_info, bonus))
        if solution_str == "boom":
            raise ValueError("cannot parse")
        if solution_str == "quit":
            sys.exit(4)
        return 1.0 + bonus

    batch = make_reward_batch(["ok", "boom", "quit"], ["s"] * 3, ["1", "2", "3"],
                              extra_infos=[{"i": 0}, {"i": 1}, {"i": 2}])
    manager = NaiveRewardManager(config={}, tokenizer=CharTokenizer(), compute_score=fn,
                                 reward_kwargs={"bonus": 0.5})
    out = manager.compute_reward(batch)
    assert seen[0] == ("s", "ok", "1", {"i": 0}, 0.5)
    assert get_non_tensor(out.batch, "score") == [1.5, 0.0, 0.0]
    assert out.metrics["reward/errors/exception"] == 1.0
    assert out.metrics["reward/errors/exit"] == 1.0
    _, _, failure = manager.failures.last
    assert failure == Failure("exit", "the function called sys.exit(4)")
    outcomes = manager.score_in_process([("s", "boom", "1", None)])
    assert outcomes == [Failure("exception", "ValueError: cannot parse")]


def test_each_retried_call_that_fails_in_a_new_way_is_warned_about_with_its_size(caplog):
    def fn(data_sources, solution_strs, ground_truths, extra_infos):
        if len(solution_strs) == 4:
            raise RuntimeError("the whole batch failed")
        if "quit" in solution_strs and len(solution_strs) == 2:
            sys.exit(1)
        return [1.0] * len(solution_strs)

    batch = make_reward_batch(["a", "b", "quit", "c"], ["x"] * 4, ["1"] * 4)
    with caplog.at_level(logging.WARNING):
        batch_manager(fn).compute_reward(batch)
    retry = [r.getMessage() for r in caplog.records if "smaller calls" in r.getMessage()]
    assert len(retry) == 2
    assert "a call on 4 samples failed (exception)" in retry[0]
    assert "a call on 2 samples failed (exit)" in retry[1]


def test_the_timeout_reason_of_a_sample_never_scored():
    manager = batch_manager(lambda *columns: [1.0] * len(columns[0]))
    out = manager.isolate(lambda part, deadline: [Scored(1.0)] * len(part), list(ROWS), 0.0)
    assert out[0] == Failure("timeout", "the step's time for rewards "
                                        "(reward_model.step_timeout_s) ran out before this "
                                        "sample was scored")


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


# ---- the base manager: settings, labels, decoding, the overlong penalty, reserved keys -----

def test_settings_are_kept_and_checked_naming_their_keys():
    def fn(**kwargs):
        return 1.0

    worker = object()
    config = {"custom_reward_function": {"reward_kwargs": {"timeout_s": 3}}}
    manager = NaiveRewardManager(config=config, worker=worker, tokenizer=CharTokenizer(),
                                 compute_score=fn)
    assert manager.role == "reward" and manager.worker is worker and manager.config is config
    assert manager.timeout_s == 3.0 and manager.reward_kwargs == {}
    assert NaiveRewardManager(config={}, tokenizer=CharTokenizer(), timeout_s=0.5).timeout_s \
        == 0.5
    with pytest.raises(ConfigError, match=r"custom_reward_function\.reward_kwargs\.timeout_s=0 "
                                          r"must be > 0"):
        NaiveRewardManager(config={}, tokenizer=CharTokenizer(), timeout_s=0)
    with pytest.raises(ConfigError, match=r"^reward_model\.step_timeout_s=-1 must be > 0"):
        NaiveRewardManager(config={"reward_model": {"step_timeout_s": -1}},
                           tokenizer=CharTokenizer())


def test_how_messages_name_the_reward_function():
    def my_score(**kwargs):
        return 1.0

    assert NaiveRewardManager(config={}, tokenizer=CharTokenizer()).function_label() == \
        "default_compute_score (the built-in rules)"
    mine = NaiveRewardManager(config={}, tokenizer=CharTokenizer(), compute_score=my_score)
    assert mine.function_label() == f"'{my_score.__qualname__}' ({__name__})"
    assert mine.failures.label == mine.function_label()
    assert "default_compute_score (the built-in rules)" in str(
        NaiveRewardManager(config={}, tokenizer=CharTokenizer()).failed_steps_error(2))


class DecodeOnly:
    """A tokenizer without batch_decode; the pad id 0 is special."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join("<pad>" if i == 0 else chr(i) for i in ids
                       if not (skip_special_tokens and i == 0))


class BatchDecodeHonouringSkip(DecodeOnly):
    def batch_decode(self, rows, skip_special_tokens=False):
        return [self.decode(r, skip_special_tokens) for r in rows]


@pytest.mark.parametrize("tokenizer", [DecodeOnly(), BatchDecodeHonouringSkip()])
def test_decoding_skips_special_tokens_whatever_the_tokenizer(tokenizer):
    manager = NaiveRewardManager(config={}, tokenizer=tokenizer)
    responses = torch.tensor([[ord("a"), 0, ord("b")], [0, ord("c"), 0]])
    mask = torch.ones(2, 3)
    assert manager.decode(responses, mask) == ["ab", "c"]
    assert manager.decode(torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 0)) == ["", ""]


def test_the_overlong_penalty_is_added_to_the_scores_and_reported():
    config = {"data": {"max_response_length": 4},
              "reward_model": {"overlong_buffer": {"enable": True, "len": 2,
                                                   "penalty_factor": 1.0}}}
    batch = make_reward_batch(["7", "777", "7777"], ["arithmetic"] * 3, ["7", "777", "0"],
                              width=4)
    out = NaiveRewardManager(config=config, tokenizer=CharTokenizer()).compute_reward(batch)
    assert get_non_tensor(out.batch, "score") == [1.0, 1.0, 0.0]
    assert get_non_tensor(out.batch, "overlong_reward") == [0.0, -0.5, -1.0]
    scores = out.batch["token_level_scores"]
    assert scores[0, 0].item() == 1.0 and scores[1, 2].item() == 0.5
    assert scores[2, 3].item() == -1.0
    assert out.metrics["reward/overlong_penalty/mean"] == pytest.approx(-0.5)
    assert out.metrics["reward/overlong/ratio"] == pytest.approx(2 / 3)
    plain = NaiveRewardManager(config={}, tokenizer=CharTokenizer()).compute_reward(
        make_reward_batch(["7"], ["arithmetic"], ["7"]))
    assert "reward/overlong/ratio" not in plain.metrics
    assert "overlong_reward" not in plain.batch.keys()


def test_an_overlong_buffer_of_one_token_and_no_penalty_factor():
    config = {"data": {"max_response_length": 4},
              "reward_model": {"overlong_buffer": {"enable": True, "len": 1}}}
    assert overlong_penalty(torch.tensor([4, 3]), config).tolist() == [0.0, 0.0]


def test_result_keys_naming_batch_fields_never_replace_them():
    def fn(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 1.0, "responses": "x", "data_source": "y", "uid": "z", "acc": True}

    batch = make_reward_batch(["a"], ["src"], ["1"])
    out = NaiveRewardManager(config={}, tokenizer=CharTokenizer(),
                             compute_score=fn).compute_reward(batch)
    assert isinstance(out.batch["responses"], torch.Tensor)
    assert get_non_tensor(out.batch, "data_source") == ["src"]
    assert "uid" not in out.batch.keys() and get_non_tensor(out.batch, "acc") == [True]


def test_custom_function_settings_defaults_and_the_timeout_taken_out():
    from siirl.engine.reward_manager.loader import custom_function_settings

    path, name, kwargs, timeout = custom_function_settings(
        {"custom_reward_function": {"path": "~/r.py",
                                    "reward_kwargs": {"timeout_s": "2.5", "k": 1}}})
    assert name == "compute_score" and kwargs == {"k": 1} and timeout == 2.5
    assert path.endswith("/r.py") and not path.startswith("~")


def test_failure_bookkeeping_details(caplog):
    assert FailureLog.metrics(dict.fromkeys(("timeout", "exception", "exit", "crash",
                                             "non_finite", "non_numeric"), 0),
                              3)["reward/retried"] == 0.0
    with caplog.at_level(logging.WARNING):
        FailureLog("fn").split([Failure("crash", "segfault")], ["d"])
    assert "reward/errors/crash" in caplog.text
    assert "beyond the bound" in check_result(2e9).reason
    assert "not finite" in check_result(math.nan).reason


def test_token_level_on_responses_of_width_zero():
    out = token_level([1.0, 2.0], torch.zeros(2, 0), torch.zeros(2, 0))
    assert out.shape == (2, 0)


# ---- the response mask fallback, empty batches, the embodied manager -------------------------

def test_without_a_response_mask_the_response_part_of_the_attention_mask_is_used():
    batch = make_reward_batch(["7", "77"], ["arithmetic"] * 2, ["7", "7"], width=3)
    mask = batch["response_mask"].clone()
    del batch["response_mask"]
    batch["attention_mask"] = torch.cat([torch.ones(2, 2), mask], dim=1)  # prompt of 2
    out = NaiveRewardManager(config={}, tokenizer=CharTokenizer()).compute_reward(batch)
    assert get_non_tensor(out.batch, "score") == [1.0, 0.0]
    assert out.batch["token_level_scores"][0].tolist() == [1.0, 0.0, 0.0]


def test_an_empty_batch_with_the_overlong_buffer_reports_zero_penalties():
    config = {"data": {"max_response_length": 4},
              "reward_model": {"overlong_buffer": {"enable": True, "len": 2}}}
    batch = make_reward_batch(["7"], ["arithmetic"], ["7"], width=4)[:0]
    out = NaiveRewardManager(config=config, tokenizer=CharTokenizer()).compute_reward(batch)
    assert out.metrics["reward/overlong_penalty/mean"] == 0.0
    assert out.metrics["reward/overlong/ratio"] == 0.0


def embodied_batch(complete, embeddings=None, uid=None, task_id=None, mask_dtype=None):
    from siirl.data_coordinator import protocol

    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]],
                        dtype=mask_dtype or torch.float32)[:len(complete)]
    fields = {"response_mask": mask, "complete": torch.tensor(complete, dtype=torch.float32)}
    if embeddings is not None:
        fields["trajectory_embedding"] = torch.tensor(embeddings, dtype=torch.float32)
    batch = protocol.make_batch(fields)
    for key, values in (("uid", uid), ("task_id", task_id)):
        if values is not None:
            protocol.set_non_tensor(batch, key, values)
    return batch


def test_the_embodied_reward_coefficient_comes_from_reward_kwargs():
    from siirl.engine.reward_manager.embodied import EmbodiedRewardManager

    manager = EmbodiedRewardManager(config={"reward_model": {"reward_kwargs":
                                                             {"reward_coef": 2.0}}})
    out = manager.compute_reward(embodied_batch([1, 0, 1]))
    assert out.batch["token_level_scores"].sum(dim=-1).tolist() == [2.0, 0.0, 2.0]
    assert torch.equal(out.batch["token_level_rewards"], out.batch["token_level_scores"])
    assert out.metrics["reward/score/mean"] == pytest.approx(4 / 3)
    assert EmbodiedRewardManager(config={}).reward_coef == 1.0


def test_embodied_failures_are_compared_within_their_task_then_group_then_all():
    from siirl.engine.reward_manager.embodied import EmbodiedRewardManager

    complete, embeddings = [1, 0, 0], [[0, 1], [0.1, 1], [0.2, 1]]
    manager = EmbodiedRewardManager()

    def progress(**keys):
        out = manager.compute_reward(embodied_batch(complete, embeddings, **keys))
        return out.batch["token_level_scores"].sum(dim=-1).tolist()

    together = progress()  # one group, "all": both failures are compared with row 0
    assert together[0] == 1.0 and together[1] > 0 and together[2] > 0
    metrics = manager.compute_reward(embodied_batch(complete, embeddings)).metrics
    assert metrics["reward/progress/mean"] == pytest.approx((together[1] + together[2]) / 2)
    assert progress(uid=["g", "g", "g"]) == together
    apart = progress(uid=["g", "h", "h"])  # rows 1 and 2 have no success in their group
    assert apart == [1.0, 0.0, 0.0]
    assert progress(uid=["g", "h", "h"], task_id=["t", "t", "t"]) == together


def test_embodied_metrics_of_batches_without_failures_or_rows():
    from siirl.engine.reward_manager.embodied import EmbodiedRewardManager

    out = EmbodiedRewardManager().compute_reward(embodied_batch([1, 1], [[0, 1], [1, 1]]))
    assert out.metrics["reward/progress/mean"] == 0.0
    assert out.metrics["reward/success_rate"] == 1.0
    empty = EmbodiedRewardManager().compute_reward(embodied_batch([]))
    assert empty.metrics["reward/success_rate"] == 0.0
    assert empty.metrics["reward/score/mean"] == 0.0


def test_embodied_scores_keep_their_fraction_with_an_integer_mask_and_skip_empty_rows():
    from siirl.engine.reward_manager.embodied import EmbodiedRewardManager

    manager = EmbodiedRewardManager(reward_coef=0.5)
    out = manager.compute_reward(embodied_batch([1, 1, 0, 1], mask_dtype=torch.long))
    scores = out.batch["token_level_scores"]
    assert scores.dtype == torch.float32
    assert scores.sum(dim=-1).tolist() == [0.5, 0.5, 0.0, 0.0]  # row 3 has no token


def test_a_partial_is_named_by_its_repr():
    import functools

    def score(bonus=0.0, **kwargs):
        return 1.0 + bonus

    fn = functools.partial(score, bonus=1.0)
    manager = NaiveRewardManager(config={}, tokenizer=CharTokenizer(), compute_score=fn)
    assert manager.function_label() == f"'{fn!r}' (functools)"


def test_an_empty_function_name_means_compute_score():
    from siirl.engine.reward_manager.loader import custom_function_settings

    settings = custom_function_settings({"custom_reward_function": {"path": "r.py",
                                                                    "name": ""}})
    assert settings[1] == "compute_score"
