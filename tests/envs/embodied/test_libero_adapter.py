"""The LIBERO adapter. Its real episode needs ``pip install 'siirl-envs[libero]'``, a
renderer (``apt-get install libosmesa6``) and LIBERO's scene assets (not in the pip
package: see siirl.environment.embodied.adapters.libero); elsewhere it skips and says
which is missing. The error for missing assets is tested wherever libero is installed,
the one for a missing package wherever it is not."""

import ctypes.util
import importlib.util
import os

import numpy as np
import pytest

from siirl.environment.embodied import check_observation, make_embodied_env
from siirl.errors import ConfigError, PluginNotFoundError

HAVE_LIBERO = importlib.util.find_spec("libero") is not None
needs_libero = pytest.mark.skipif(not HAVE_LIBERO, reason="libero is not installed: "
                                  "pip install 'siirl-envs[libero]'")


def _why_skip():
    if not HAVE_LIBERO:
        return "libero is not installed: pip install 'siirl-envs[libero]'"
    renderer = os.environ.get("MUJOCO_GL", "osmesa").lower()
    library = {"osmesa": "OSMesa", "egl": "EGL"}.get(renderer)
    if library is None or ctypes.util.find_library(library) is None:
        return f"no lib{library} for MUJOCO_GL={renderer}: apt-get install libosmesa6"
    from siirl.environment.embodied.adapters.libero import find_assets

    try:
        find_assets(os.environ.get("SIIRL_LIBERO_ASSETS") or None)
    except PluginNotFoundError as exc:
        return f"LIBERO's scene assets are missing ({exc})"
    return None


needs_assets = pytest.mark.skipif(_why_skip() is not None, reason=str(_why_skip()))


def test_bad_suites_and_tasks_are_config_errors():
    with pytest.raises(ConfigError, match="no suite 'libero_100'.*libero_spatial"):
        make_embodied_env("libero", {"suites": ["libero_100"]})
    with pytest.raises(ConfigError, match="no task 'libero_goal/10'"):
        make_embodied_env("libero", {"suites": ["libero_goal"], "tasks": ["libero_goal/10"]})


@pytest.mark.skipif(HAVE_LIBERO, reason="libero is installed")
def test_missing_libero_names_the_install_command():
    with pytest.raises(PluginNotFoundError, match=r"pip install 'siirl-envs\[libero\]'"):
        make_embodied_env("libero")


@needs_libero
def test_missing_assets_say_what_is_missing_and_how_to_get_them(tmp_path):
    with pytest.raises(PluginNotFoundError) as raised:
        make_embodied_env("libero", {"assets_path": str(tmp_path / "nowhere")})
    message = str(raised.value)
    assert "scene assets" in message and "nowhere (the assets_path setting: no such" in message
    assert "github.com/Lifelong-Robot-Learning/LIBERO" in message
    assert "assets_path: <clone>/libero/libero/assets" in message
    (tmp_path / "scenes").mkdir()  # a partial copy names the folders it lacks
    with pytest.raises(PluginNotFoundError, match="lacks articulated_objects/, "
                                                  "stable_hope_objects/"):
        make_embodied_env("libero", {"assets_path": str(tmp_path)})


@needs_assets
def test_a_libero_episode_starts_and_steps():
    config = {"suites": ["libero_spatial"], "tasks": ["libero_spatial/0"],
              "assets_path": os.environ.get("SIIRL_LIBERO_ASSETS") or None}
    with make_embodied_env("libero", config) as env:
        assert env.max_steps == 220 and env.action_dim == 7
        obs = env.reset("libero_spatial/0", seed=0)
        check_observation(obs)
        assert obs["image"].shape == (128, 128, 3) and obs["proprio"].shape == (9,)
        assert "black bowl" in obs["instruction"]
        again = env.reset("libero_spatial/0", seed=0)
        assert np.array_equal(obs["proprio"], again["proprio"])
        assert np.array_equal(obs["image"], again["image"])
        other = env.reset("libero_spatial/0", seed=1)  # another stored initial state
        assert not np.array_equal(obs["image"], other["image"])
        up = [[0, 0, 1, 0, 0, 0, -1]] * 5
        moved, reward, done, info = env.step(up)
        assert moved["proprio"][2] > other["proprio"][2]
        assert info["success"] is False and not done and info["steps"] == 5
