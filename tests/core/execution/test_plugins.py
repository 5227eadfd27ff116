"""siirl.plugins: entry-point lookup, in-process registration and install hints."""

from importlib.metadata import EntryPoint

import pytest

import siirl.plugins as plugins
from siirl.errors import PluginNotFoundError, SiirlError
from siirl.execution.dag import builtin_pipelines as bp
from siirl.plugins import available, install_hint, load_plugin, register, unregister


def _fake_entry_points(*eps):
    def entry_points(group=None):
        return [ep for ep in eps if ep.group == group]
    return entry_points


def test_builtin_pipelines_are_registered():
    names = available("siirl.pipelines")
    assert {"grpo", "ppo", "dapo", "embodied"} <= set(names)
    assert names == sorted(names)


def test_load_builtin_pipeline_plugin():
    assert load_plugin("siirl.pipelines", "grpo") is bp.grpo_pipeline


def test_missing_name_message():
    with pytest.raises(PluginNotFoundError) as info:
        load_plugin("siirl.pipelines", "no_such_pipeline_xyz", what="dag.pipeline")
    msg = str(info.value)
    assert "siirl.pipelines" in msg and "no_such_pipeline_xyz" in msg
    for name in ("grpo", "ppo", "dapo", "embodied"):
        assert name in msg
    assert '[project.entry-points."siirl.pipelines"]' in msg  # no made-up pip line
    assert "dag.pipeline" in msg
    assert isinstance(info.value, SiirlError)


@pytest.mark.parametrize("call", [
    lambda: load_plugin("siirl.nope", "x"),
    lambda: available("siirl.nope"),
    lambda: register("siirl.nope", "x"),
])
def test_unknown_group(call):
    with pytest.raises(PluginNotFoundError) as info:
        call()
    msg = str(info.value)
    assert "siirl.nope" in msg and "siirl.engines" in msg


def test_unregister_unknown_group():
    with pytest.raises(PluginNotFoundError, match="siirl.nope"):
        unregister("siirl.nope", "x")


def test_register_and_unregister_in_process():
    marker = object()
    try:
        assert register("siirl.engines", "test_local_engine")(marker) is marker
        assert "test_local_engine" in available("siirl.engines")
        assert load_plugin("siirl.engines", "test_local_engine") is marker
        register("siirl.engines", "test_local_engine")(marker)  # same object: fine
        with pytest.raises(PluginNotFoundError, match="already registered"):
            register("siirl.engines", "test_local_engine")(object())
    finally:
        unregister("siirl.engines", "test_local_engine")
    assert "test_local_engine" not in available("siirl.engines")
    with pytest.raises(PluginNotFoundError):
        load_plugin("siirl.engines", "test_local_engine")
    unregister("siirl.engines", "test_local_engine")  # twice is harmless


def test_local_registration_shadows_entry_point():
    def fake():
        return None
    try:
        register("siirl.pipelines", "grpo")(fake)
        assert load_plugin("siirl.pipelines", "grpo") is fake
    finally:
        unregister("siirl.pipelines", "grpo")
    assert load_plugin("siirl.pipelines", "grpo") is bp.grpo_pipeline


def test_megatron_hint(monkeypatch):
    monkeypatch.setattr(plugins, "entry_points", _fake_entry_points())
    with pytest.raises(PluginNotFoundError) as info:
        load_plugin("siirl.engines", "megatron")
    msg = str(info.value)
    assert 'pip install "siirl-engine[megatron]"' in msg
    assert "installed: none" in msg


@pytest.mark.parametrize("group,name,package", [
    ("siirl.engines", "megatron", "siirl-engine[megatron]"),
    ("siirl.engines", "fsdp", "siirl-engine"),
    ("siirl.rollouts", "hf", "siirl-engine"),
    ("siirl.reward_managers", "naive", "siirl-engine"),
    ("siirl.pipelines", "grpo", "siirl-core"),
])
def test_install_hint(group, name, package):
    assert install_hint(group, name) == f'pip install "{package}"'


@pytest.mark.parametrize("group,name", [("siirl.rollouts", "trtllm"),
                                        ("siirl.environments", "libero"),
                                        ("siirl.pipelines", "x")])
def test_no_pip_line_for_what_no_distribution_provides(group, name):
    hint = install_hint(group, name)
    assert "pip install" not in hint and f'[project.entry-points."{group}"]' in hint


def test_provided_names_and_extras_match_the_pyproject_files():
    """Hints and --help name only what the distributions really register (and extras
    they really declare)."""
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[3] / "packages"
    declared, extras = {}, {}
    for project in root.glob("*/pyproject.toml"):
        meta = tomllib.loads(project.read_text())["project"]
        for group, names in meta.get("entry-points", {}).items():
            for name in names:
                declared.setdefault(group, {})[name] = meta["name"]
        extras[meta["name"]] = set(meta.get("optional-dependencies", {}))
    for group in plugins.GROUPS:
        provided = plugins.PROVIDED[group]
        assert set(provided) == set(declared.get(group, {})), group
        for name, package in provided.items():
            dist, _, extra = package.partition("[")
            assert dist == declared[group][name], (group, name)
            assert not extra or extra.rstrip("]") in extras[dist], package


def test_broken_entry_point_gives_pip_hint(monkeypatch):
    broken = EntryPoint("broken", "nonexistent_mod_xyz:f", "siirl.engines")
    monkeypatch.setattr(plugins, "entry_points", _fake_entry_points(broken))
    assert available("siirl.engines") == ["broken"]
    with pytest.raises(PluginNotFoundError) as info:
        load_plugin("siirl.engines", "broken", what="actor_rollout_ref.actor.strategy=broken")
    msg = str(info.value)
    assert "broken" in msg and "siirl.engines" in msg and "nonexistent_mod_xyz" in msg
    assert 'pip install "siirl-engine"' in msg
    assert "actor_rollout_ref.actor.strategy" in msg
    assert isinstance(info.value.__cause__, ImportError)


def test_stale_entry_point_attribute(monkeypatch):
    stale = EntryPoint("stale", "siirl.plugins:no_such_factory", "siirl.engines")
    monkeypatch.setattr(plugins, "entry_points", _fake_entry_points(stale))
    with pytest.raises(PluginNotFoundError, match="stale"):
        load_plugin("siirl.engines", "stale")


def test_entry_point_loaded_from_fake(monkeypatch):
    ep = EntryPoint("mine", "siirl.execution.dag.builtin_pipelines:ppo_pipeline",
                    "siirl.pipelines")
    monkeypatch.setattr(plugins, "entry_points", _fake_entry_points(ep))
    assert available("siirl.pipelines") == ["mine"]
    assert load_plugin("siirl.pipelines", "mine") is bp.ppo_pipeline


def test_conflicting_entry_points(monkeypatch):
    first = EntryPoint("dup", "pkg_a:f", "siirl.engines")
    second = EntryPoint("dup", "pkg_b:f", "siirl.engines")
    monkeypatch.setattr(plugins, "entry_points", _fake_entry_points(first, second))
    with pytest.raises(PluginNotFoundError) as info:
        available("siirl.engines")
    msg = str(info.value)
    assert "dup" in msg and "pkg_a:f" in msg and "pkg_b:f" in msg


def test_vllm_hint_names_the_extra():
    assert "siirl-engine[vllm]" in install_hint("siirl.rollouts", "vllm")


def test_sglang_hint_names_the_extra():
    assert install_hint("siirl.rollouts", "sglang") == 'pip install "siirl-engine[sglang]"'
