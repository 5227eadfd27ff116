"""NameRegistry: the table behind core_algos' estimator, loss, aggregation and KL lookups."""

import pytest

from siirl.dag_worker.core_algos import get_adv_estimator_fn, registered_adv_estimators
from siirl.dag_worker.core_algos.name_registry import NameRegistry
from siirl.errors import ConfigError
from siirl.execution.scheduler.enums import AdvantageEstimator


def test_register_get_and_names():
    registry = NameRegistry("x.key", "widget")
    registry.register("a", "alias")(len)
    assert registry.get("a") is len and registry.get("alias") is len
    assert registry.names() == ["a", "alias"] and "a" in registry


def test_unknown_name_lists_registered_and_names_key():
    registry = NameRegistry("x.key", "widget")
    registry.add("a", len)
    with pytest.raises(ConfigError, match=r"x.key='b' is not a registered widget; registered: a"):
        registry.get("b")


def test_conflicting_registration_is_refused():
    registry = NameRegistry("x.key", "widget")
    registry.add("a", len)
    registry.add("a", len)  # same object again is fine
    with pytest.raises(ValueError, match="already registered"):
        registry.add("a", abs)


def test_enum_members_and_spec_estimators():
    assert get_adv_estimator_fn(AdvantageEstimator.GRPO) is get_adv_estimator_fn("grpo")
    assert {"grpo", "gae"} <= set(registered_adv_estimators())
    with pytest.raises(ConfigError, match="algorithm.adv_estimator='nope'.*grpo"):
        get_adv_estimator_fn("nope")
