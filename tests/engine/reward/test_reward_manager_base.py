"""The base reward manager: settings, labels, decoding, the overlong penalty, reserved
keys, failure bookkeeping.

Everything runs in this process (function objects, no worker processes), so it is fast.
Each test states a behaviour that mutation testing (``nox -s mutmut -- reward``) found
no test for; docs/mutation.md lists the mutants they kill and the ones that change
nothing observable.
"""

import logging
import math

import pytest
import torch
from reward_fakes import CharTokenizer, make_reward_batch

from siirl.data_coordinator.protocol import get_non_tensor
from siirl.engine.reward_manager.columns import token_level
from siirl.engine.reward_manager.failures import FailureLog
from siirl.engine.reward_manager.naive import NaiveRewardManager
from siirl.engine.reward_manager.outcome import Failure, check_result
from siirl.engine.reward_manager.overlong import overlong_penalty
from siirl.errors import ConfigError

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
