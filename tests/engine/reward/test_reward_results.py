"""What a reward function returns: checking one result, extra columns, score metrics,
failure bookkeeping and the overlong penalty.

Everything runs in this process (function objects, no worker processes), so it is fast.
Each test states a behaviour that mutation testing (``nox -s mutmut -- reward``) found
no test for; docs/mutation.md lists the mutants they kill and the ones that change
nothing observable.
"""

import logging
import math

import numpy as np
import pytest
import torch
from reward_fakes import CharTokenizer

from siirl.engine.reward_manager.columns import extra_columns, score_metrics, token_level
from siirl.engine.reward_manager.failures import FailureLog
from siirl.engine.reward_manager.naive import NaiveRewardManager
from siirl.engine.reward_manager.outcome import Failure, Scored, check_result
from siirl.engine.reward_manager.overlong import overlong_penalty
from siirl.errors import ConfigError

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
