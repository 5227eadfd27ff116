"""The robosuite adapter against the real simulator (Lift and Stack with a Panda arm).

Needs ``pip install 'siirl-envs[robosuite]'`` and a renderer (``apt-get install
libosmesa6``); where either is missing these tests skip and say which (``nox -s
embodied_sim`` runs them). The tests of the missing-package error run where robosuite
is absent."""

import ctypes.util
import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from siirl.environment.embodied import (
    VectorEmbodiedEnv,
    check_observation,
    embodied_env_names,
    make_embodied_env,
)
from siirl.errors import ConfigError, PluginNotFoundError

HAVE_ROBOSUITE = importlib.util.find_spec("robosuite") is not None


def _why_skip():
    if not HAVE_ROBOSUITE:
        return "robosuite is not installed: pip install 'siirl-envs[robosuite]'"
    renderer = os.environ.get("MUJOCO_GL", "osmesa").lower()
    library = {"osmesa": "OSMesa", "egl": "EGL"}.get(renderer)
    if library is None:
        return f"MUJOCO_GL={renderer} is neither osmesa nor egl"
    if ctypes.util.find_library(library) is None:
        return f"lib{library} is missing: apt-get install libosmesa6 (MUJOCO_GL=osmesa)"
    return None


needs_sim = pytest.mark.skipif(_why_skip() is not None, reason=str(_why_skip()))

UP = [0, 0, 1, 0, 0, 0, -1]  # raise the hand, gripper open


@pytest.fixture(scope="module")
def env():
    env = make_embodied_env("robosuite", {"tasks": ["Lift", "Stack"]})
    yield env
    env.close()


def test_registered_without_importing_the_simulator():
    assert {"robosuite", "libero"} <= set(embodied_env_names())
    code = ("import sys, siirl.environment.embodied as e; "
            "e.embodied_env_class('robosuite'); e.embodied_env_class('libero'); "
            "print(sorted(m for m in ('robosuite', 'mujoco', 'libero') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="no task 'Wipe'.*Lift"):
        make_embodied_env("robosuite", {"tasks": ["Wipe"]})
    with pytest.raises(ConfigError, match="no setting 'camera_name'"):
        make_embodied_env("robosuite", {"camera_name": "agentview"})


def test_a_missing_renderer_names_the_system_package(monkeypatch):
    from siirl.environment.embodied.adapters import common

    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    monkeypatch.setattr(common, "_loadable", lambda library: False)
    with pytest.raises(PluginNotFoundError, match="libOSMesa.*apt-get install libosmesa6"):
        common.prepare_rendering(None, "robosuite", "robosuite")
    with pytest.raises(ConfigError, match="renderer='vulkan'.*osmesa, egl"):
        common.prepare_rendering("vulkan", "robosuite", "robosuite")


@pytest.mark.skipif(HAVE_ROBOSUITE, reason="robosuite is installed")
def test_missing_robosuite_names_the_install_command():
    with pytest.raises(PluginNotFoundError, match=r"pip install 'siirl-envs\[robosuite\]'"):
        make_embodied_env("robosuite")


@needs_sim
@pytest.mark.parametrize("task, words", [("Lift", "lift the red cube"),
                                         ("Stack", "stack the red cube on the green cube")])
def test_reset_gives_an_observation_and_no_success(env, task, words):
    obs = env.reset(task, seed=0)
    check_observation(obs)
    assert obs["image"].shape == (128, 128, 3) and obs["proprio"].shape == (9,)
    assert obs["instruction"] == words
    assert obs["image"].std() > 5  # a scene, not a blank frame
    assert np.array_equal(env.render(), obs["image"])
    quat = obs["proprio"][3:7]
    assert abs(float(np.linalg.norm(quat)) - 1.0) < 1e-3
    _, reward, done, info = env.step(np.zeros((1, 7)))
    assert info["success"] is False and not done and reward == 0.0
    assert env.action_dim == 7 and env.max_steps == 300


@needs_sim
def test_the_same_seed_gives_the_same_initial_state(env):
    first = env.reset("Lift", seed=5)
    after_first = env.step([UP] * 3)[0]
    other = env.reset("Lift", seed=6)
    env.reset("Stack", seed=5)  # another task in between: the simulator is rebuilt
    again = env.reset("Lift", seed=5)
    assert np.array_equal(first["image"], again["image"])
    assert np.array_equal(first["proprio"], again["proprio"])
    assert not np.array_equal(first["proprio"], other["proprio"])
    after_again = env.step([UP] * 3)[0]
    assert np.array_equal(after_first["proprio"], after_again["proprio"])


@needs_sim
def test_scripted_actions_move_the_gripper(env):
    start = env.reset("Lift", seed=1)["proprio"]
    obs, _, done, info = env.step([UP] * 8)
    assert obs["proprio"][2] - start[2] > 0.04  # the hand rises (about 1 cm an action)
    assert info["steps"] == 8 and info["clipped"] == 0 and not done
    assert not np.array_equal(obs["image"], env.reset("Lift", seed=1)["image"])
    opened = env.step(np.zeros((1, 7)))[0]["proprio"][7:]
    closed = env.step([[0, 0, 0, 0, 0, 0, 1]] * 6)[0]["proprio"][7:]
    assert closed[0] - closed[1] < opened[0] - opened[1] - 0.01  # the fingers close
    _, _, _, info = env.step([[0, 0, 2.0, 0, 0, 0, -1]])  # out of range: clipped
    assert info["clipped"] == 1 and info["success"] is False


@needs_sim
def test_a_vector_of_two_robosuite_envs_steps(env):
    want = env.reset("Lift", seed=3)["proprio"]  # an env of all tasks, in this process
    config = {"tasks": ["Lift"], "image_size": 64}
    with VectorEmbodiedEnv("robosuite", num_envs=2, config=config,
                           step_timeout_s=60) as venv:
        assert venv.action_dim == 7 and venv.task_ids == ["Lift"]
        obs = venv.reset("Lift", seeds=[3, 3])
        assert obs["image"].shape == (2, 64, 64, 3)
        assert np.array_equal(obs["proprio"][0], want)  # seeds do not hang on the
        assert np.array_equal(obs["proprio"][1], want)  # task list, nor on the process
        obs, rewards, dones, infos = venv.step(np.tile(UP, (2, 2, 1)))
        assert obs["proprio"].shape == (2, 9) and rewards.shape == (2,)
        assert not dones.any() and [i["steps"] for i in infos] == [2, 2]
        assert venv.errors == {"timeout": 0, "crash": 0, "step": 0}


@needs_sim
def test_close_leaves_no_error_at_interpreter_shutdown():
    code = textwrap.dedent("""
        from siirl.environment.embodied import make_embodied_env
        env = make_embodied_env("robosuite", {"tasks": ["Lift"], "image_size": 32})
        env.reset("Lift", 0)
        env.step([[0, 0, 0, 0, 0, 0, 1]])
        env.close()
        env.close()  # twice is harmless
        print("closed")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("closed")
    noise = [line for line in out.stderr.splitlines()
             if "Exception ignored" in line or "Error" in line or "Traceback" in line]
    assert not noise, out.stderr
