"""parallel reward manager: worker processes, per-row timeouts, failures cost one row."""

import logging
import textwrap
import time

import pytest
from reward_fakes import CharTokenizer, make_reward_batch

from siirl.data_coordinator.protocol import get_non_tensor
from siirl.engine.reward_manager.parallel import ParallelRewardManager
from siirl.errors import ConfigError

REWARD_FILE = """
    import os, time

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        if solution_str == "hang":
            time.sleep(3600)
        if solution_str == "boom":
            raise RuntimeError("bad row")
        if solution_str == "die":
            os._exit(3)
        return {"score": float(solution_str == ground_truth) + bonus, "pid": os.getpid()}
"""


@pytest.fixture
def reward_path(tmp_path):
    path = tmp_path / "parallel_reward.py"
    path.write_text(textwrap.dedent(REWARD_FILE))
    return str(path)


@pytest.fixture
def manager_factory():
    made = []

    def make(**kwargs):
        manager = ParallelRewardManager(tokenizer=CharTokenizer(), **kwargs)
        made.append(manager)
        return manager

    yield make
    for manager in made:
        manager.close()


def test_raising_and_hanging_rows_cost_only_themselves(reward_path, manager_factory, caplog):
    config = {"custom_reward_function": {"path": reward_path,
                                         "reward_kwargs": {"bonus": 0.25, "timeout_s": 30}}}
    manager = manager_factory(config=config, timeout_s=1.0, num_workers=2)
    assert manager.timeout_s == 1.0  # the constructor wins over reward_kwargs.timeout_s
    texts = ["a", "hang", "boom", "b", "die", "c"]
    batch = make_reward_batch(texts, ["src"] * 6, ["a", "x", "x", "b", "x", "x"])
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        out = manager.compute_reward(batch)
    elapsed = time.monotonic() - start
    assert elapsed < 8.0, elapsed  # worker start-up + one 1 s timeout, never the sleep
    assert get_non_tensor(out.batch, "score") == [1.25, 0.0, 0.0, 1.25, 0.0, 0.25]
    assert out.metrics["reward/errors/timeout"] == 1.0
    assert out.metrics["reward/errors/exception"] == 1.0
    assert out.metrics["reward/errors/exit"] == 1.0  # the dead worker
    assert out.metrics["reward/errors"] == 3.0
    assert out.batch["token_level_scores"][3, 0] == 1.25
    text = caplog.text
    assert "sample 1 (data_source 'src')" in text and "no result within timeout_s=1 s" in text
    assert "sample 2 (data_source 'src')" in text and "RuntimeError: bad row" in text
    assert "sample 4" in text and "exit code 3" in text

    # the killed workers were replaced: the next call works and is quick
    start = time.monotonic()
    again = manager.compute_reward(make_reward_batch(["a", "b"], ["src"] * 2, ["a", "b"]))
    assert get_non_tensor(again.batch, "score") == [1.25, 1.25]
    assert time.monotonic() - start < 5.0


def test_default_rules_and_config_timeout(manager_factory):
    manager = manager_factory(config={"custom_reward_function": {
        "reward_kwargs": {"timeout_s": 4.5}}}, num_workers=1)
    assert manager.timeout_s == 4.5 and manager.is_default
    batch = make_reward_batch(["68", "#### 72"], ["arithmetic", "openai/gsm8k"], ["68", "72"])
    out = manager.compute_reward(batch)
    assert get_non_tensor(out.batch, "score") == [1.0, 1.0]
    assert get_non_tensor(out.batch, "acc") == [True, False]
    assert out.metrics["reward/errors"] == 0.0 and out.metrics["reward/errors/timeout"] == 0.0
    # a data_source without a rule is a setup error: raised in the parent, not a 0.0
    with pytest.raises(ConfigError, match="'nope'.*custom_reward_function.path"):
        manager.compute_reward(make_reward_batch(["1"], ["nope"], ["1"]))
    out = manager.compute_reward(make_reward_batch(["3"], ["arithmetic"], ["3"]))
    assert get_non_tensor(out.batch, "score") == [1.0]


def test_importable_function_object(manager_factory):
    from siirl.user_interface.rewards_interface.custom_gsm8k_reward import compute_score

    manager = manager_factory(config={}, compute_score=compute_score, num_workers=1)
    out = manager.compute_reward(make_reward_batch(["it is 72.", "it is 7"], ["openai/gsm8k"] * 2,
                                                   ["72", "72"]))
    assert get_non_tensor(out.batch, "score") == [1.0, 0.0]
    assert get_non_tensor(out.batch, "acc") == [True, False]
