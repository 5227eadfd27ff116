"""Skipped optimizer updates are counted and explained once; a run whose rewards all fail
stops after reward_model.max_failed_steps such steps in a row."""

import io

import pytest

from siirl.dag_worker.walk.step_health import SKIPPED, StepHealth
from siirl.errors import SiirlError
from siirl.params.typed import to_typed


class Stop(SiirlError):
    pass


class FakeReward:
    def failed_steps_error(self, steps):
        return Stop(f"reward broke for {steps} steps")


def health(max_failed_steps=3, engine=None):
    stream = io.StringIO()
    config = {"reward_model": {"max_failed_steps": max_failed_steps}}
    return StepHealth(to_typed(config), lambda: engine, stream=stream), stream


def test_skipped_updates_are_counted_per_step_and_explained_once():
    h, stream = health()
    clean = {"actor/skipped_steps": 0.0, "critic/skipped_steps": 0.0}
    h.count_skipped(1, clean)
    assert clean[SKIPPED] == 0.0 and stream.getvalue() == ""
    bad = {"actor/skipped_steps": 2.0, "critic/skipped_steps": 1.0,
           "actor/grad_norm": float("nan"), "actor/pg_loss": float("nan")}
    h.count_skipped(2, bad)
    assert bad[SKIPPED] == 3.0
    said = stream.getvalue()
    assert said.count("\n") == 1 and "step 2: 3 optimizer update(s) skipped" in said
    assert "actor: 2, critic: 1" in said and "actor/pg_loss=nan" in said and SKIPPED in said
    h.count_skipped(4, {"actor/skipped_steps": 1.0})
    assert stream.getvalue().count("\n") == 1  # said once
    assert "4 optimizer update(s) were skipped" in h.summary() and "steps 2, 4" in h.summary()
    quiet, _ = health()
    assert quiet.summary() is None


def test_consecutive_failed_reward_steps_stop_the_run():
    h, _ = health(3, FakeReward())
    failed = {"reward/samples": 64.0, "reward/errors": 64.0}
    h.check_rewards(failed)
    h.check_rewards(failed)
    h.check_rewards({"reward/samples": 64.0, "reward/errors": 63.0})  # one scored: reset
    h.check_rewards(failed)
    h.check_rewards(failed)
    with pytest.raises(Stop, match="for 3 steps"):
        h.check_rewards(failed)


def test_no_reward_node_or_limit_zero_never_stops():
    h, _ = health(1, FakeReward())
    h.check_rewards({"actor/pg_loss": 0.1})  # a workflow without a reward node
    never, _ = health(0, FakeReward())
    for _ in range(5):
        never.check_rewards({"reward/samples": 8.0, "reward/errors": 8.0})
    generic, _ = health(1, None)  # a reward engine without failed_steps_error
    with pytest.raises(SiirlError, match="max_failed_steps=1"):
        generic.check_rewards({"reward/samples": 8.0, "reward/errors": 8.0})
