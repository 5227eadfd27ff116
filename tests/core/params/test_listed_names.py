"""Names come from their registries: --help lists the names of estimators, weightings,
engines, reward managers and built-in models as registered when it prints, and the lr
schedules the validation pass accepts are those the installed config sections list. A name
registered by user code or a plugin package shows (and validates) with no edit in
siirl.params."""

import os
import subprocess
import sys
import textwrap

import pytest

from siirl import plugins
from siirl.dag_worker import core_algos
from siirl.dag_worker.core_algos import names
from siirl.params.help import format_help

PLUGIN = textwrap.dedent('''
    from dataclasses import dataclass

    from siirl.params.sections import ConfigSection, Mount


    @dataclass
    class WarmRestartsArguments:
        """The warm-restarts package's settings."""

        cycles: int = 2


    SECTION = ConfigSection(schema=WarmRestartsArguments,
                            mounts=(Mount("algorithm.warm_restarts", "algorithm"),),
                            names={"lr_schedules": ("warm_restarts",),
                                   "builtin_models": ("builtin:toy-model",)})
''')
SCHEDULE = "actor_rollout_ref.actor.optim.lr_scheduler_type"
CHECK = f"""
from siirl.params.parser import parse_config
from siirl.params.validation import InvalidConfigError
try:
    parse_config(["{SCHEDULE}=warm_restarts"], validate=True)
    print("valid")
except InvalidConfigError as error:
    print(error)
"""


def _line(group, key):
    return next(line for line in format_help(group).splitlines()
                if line.split() and line.split()[0] == key)


def test_help_lists_the_installed_and_registered_names():
    assert "Training backend: fsdp or megatron." in _line("actor_rollout_ref.actor", "strategy")
    assert "(builtin:tiny-arith, builtin:tiny-arith-hd32, builtin:tiny-agent, " \
           "builtin:tiny-vla, builtin:tiny-moe, builtin:tiny-repeat)" \
        in _line("actor_rollout_ref.model", "path")
    assert "STD_weight, clip_filter_like_weight or naive." in _line(
        "algorithm", "weight_factor_in_cpgd")
    estimators = _line("algorithm", "adv_estimator")
    assert all(name in estimators for name in names.ADV_ESTIMATORS.names())


def test_a_name_registered_now_shows_in_help():
    estimator, manager = "test_only_estimator", "test_only_manager"
    assert estimator not in _line("algorithm", "adv_estimator")
    try:
        core_algos.register_adv_est(estimator)(lambda *args, **kwargs: None)
        plugins.register("siirl.reward_managers", manager)(object)
        assert estimator in _line("algorithm", "adv_estimator")
        assert f"{manager} (a name in the siirl.reward_managers" in _line("reward_model",
                                                                          "reward_manager")
        assert f"{manager}, or a siirl.reward_managers entry point" in _line(
            "reward_manager", "source")
    finally:
        names.ADV_ESTIMATORS._entries.pop(estimator, None)
        plugins.unregister("siirl.reward_managers", manager)


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    """A package registering a config section that lists an lr schedule and a built-in
    model, installed as pip would (a dist-info folder on PYTHONPATH)."""
    site = tmp_path_factory.mktemp("site")
    (site / "warm_restarts").mkdir()
    (site / "warm_restarts" / "__init__.py").write_text("")
    (site / "warm_restarts" / "config.py").write_text(PLUGIN)
    info = site / "warm_restarts-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: warm-restarts\n"
                                   "Version: 0.0.0\n")
    (info / "entry_points.txt").write_text("[siirl.config]\n"
                                           "warm_restarts = warm_restarts.config:SECTION\n")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path)


def _run(env, *args):
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=300, check=True).stdout


def test_an_lr_schedule_a_plugin_registers_validates(plugin_env):
    refused = _run(dict(os.environ), "-c", CHECK)
    assert f"{SCHEDULE}='warm_restarts': must be one of: constant, cosine" in refused
    assert _run(plugin_env, "-c", CHECK).strip() == "valid"
    described = _run(plugin_env, "-m", "siirl.main_dag", "--help", "actor_rollout_ref.model")
    assert "builtin:tiny-moe, builtin:tiny-repeat, builtin:toy-model)" in described
