"""Calling the user's reward function: one call of a batch function, the batch manager
with a function object (its calls, the halving search, the step budget), and per-row
calls of a function object.

Everything runs in this process (function objects, no worker processes), so it is fast.
Each test states a behaviour that mutation testing (``nox -s mutmut -- reward``) found
no test for; docs/mutation.md lists the mutants they kill and the ones that change
nothing observable.
"""

import logging
import math
import sys

import pytest
from reward_fakes import CharTokenizer, make_reward_batch

from siirl.data_coordinator.protocol import get_non_tensor
from siirl.engine.reward_manager.batch import BatchRewardManager
from siirl.engine.reward_manager.naive import NaiveRewardManager
from siirl.engine.reward_manager.outcome import Failure, Scored, call_batch
from siirl.errors import ConfigError

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
