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


def test_builtins_are_named_before_their_module_is_imported():
    registry = NameRegistry("x.key", "widget", {"size": "builtins:len"})
    assert registry.names() == ["size"] and "size" in registry
    assert registry.get("size") is len
    with pytest.raises(ValueError, match="already registered"):
        registry.add("size", abs)


def test_every_builtin_name_resolves_to_its_implementation():
    from siirl.dag_worker.core_algos import names

    tables = [v for v in vars(names).values() if isinstance(v, NameRegistry)]
    assert len(tables) == 6
    for table in tables:
        for name in table.names():
            assert table.get(name) is not None, (table.what, name)


def test_the_names_are_read_without_importing_torch():
    import subprocess
    import sys

    script = ("import sys\nfrom siirl.dag_worker.core_algos import names\n"
              "assert names.POLICY_LOSSES.names() and names.ADV_ESTIMATORS.names()\n"
              "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
