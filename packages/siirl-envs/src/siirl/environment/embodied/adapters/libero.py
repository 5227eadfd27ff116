"""``libero`` (extra ``siirl-envs[libero]``): the LIBERO benchmark suites.

Task ids are ``<suite>/<index>``: ``libero_spatial/0`` .. ``libero_spatial/9``, and the
same for ``libero_object``, ``libero_goal`` and ``libero_10`` (``libero_90/0`` ..
``libero_90/89`` too, when ``suites`` names it). Index order is LIBERO's own (task order
0). The instruction is the task's language annotation; ``success`` is the BDDL goal
(LIBERO's ``check_success``). A seed picks one of the task's 50 stored initial states
(``seed % 50``); then, as in LIBERO's evaluations, the arm idles ``settle_steps``
actions so the objects come to rest (not counted in the episode).

Episode lengths (``max_steps`` left out): LIBERO's usual limits per suite,
libero_spatial 220, libero_object 280, libero_goal 300, libero_10 520, libero_90 400;
``max_steps`` sets one limit for all. Actions, proprio and image are those of
:class:`~siirl.environment.embodied.adapters.common.ArmEnv` (OSC_POSE, 7 dims).
``image_flip="rot180"`` gives frames as OpenVLA-style LIBERO datasets store them.

Assets: the ``libero`` package ships the BDDL files and initial states but not the scene
assets (~200 MB of meshes and textures in LIBERO's source repository). They are found,
in order, at the ``assets_path`` setting, the ``assets`` entry of LIBERO's config
(``$LIBERO_CONFIG_PATH`` or ``~/.libero``, ``config.yaml``), then inside the package;
nothing is downloaded. Missing assets are a clear error that says how to get them::

    git clone https://github.com/Lifelong-Robot-Learning/LIBERO
    # then env config assets_path: <clone>/libero/libero/assets

Without a config file, ``import libero`` asks questions on stdin; the adapter then
writes a default one into a private temporary folder and points LIBERO there.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from siirl.environment.embodied.adapters.common import ArmEnv, import_robosuite
from siirl.errors import ConfigError, PluginNotFoundError

EXTRA = "libero"
#: suite -> (number of tasks, LIBERO's usual episode limit)
SUITES: Dict[str, Tuple[int, int]] = {
    "libero_spatial": (10, 220), "libero_object": (10, 280), "libero_goal": (10, 300),
    "libero_10": (10, 520), "libero_90": (90, 400)}
DEFAULT_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")
#: the asset folders LIBERO's scenes load from
ASSET_DIRS = ("articulated_objects", "scenes", "stable_hope_objects",
              "stable_scanned_objects", "turbosquid_objects")
SOURCE_REPO = "https://github.com/Lifelong-Robot-Learning/LIBERO"
_IDLE = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64)  # hold still, gripper open


def _package_root() -> str:
    """The folder of ``libero.libero`` (found without importing it)."""
    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        raise PluginNotFoundError(
            f"environment 'libero' needs the 'libero' package: pip install "
            f"'siirl-envs[{EXTRA}]' (and apt-get install libosmesa6 to render without "
            "a GPU)")
    return os.path.join(list(spec.submodule_search_locations)[0], "libero")


def _config_file() -> str:
    folder = os.environ.get("LIBERO_CONFIG_PATH", os.path.expanduser("~/.libero"))
    return os.path.join(folder, "config.yaml")


def _read_config(path: str) -> Dict[str, Any]:
    import yaml  # a dependency of libero (and hydra)

    with open(path, encoding="utf-8") as handle:
        return dict(yaml.safe_load(handle) or {})


def _missing(folder: str) -> List[str]:
    return [d for d in ASSET_DIRS if not os.path.isdir(os.path.join(folder, d))]


def find_assets(assets_path: Optional[str] = None) -> str:
    """The LIBERO assets folder (see the module docstring), or a PluginNotFoundError
    naming where it looked, what is missing and how to get it."""
    root = _package_root()
    config = _config_file()
    if assets_path:
        candidates = [("the assets_path setting", os.path.expanduser(str(assets_path)))]
    else:
        candidates = []
        if os.path.isfile(config):
            value = _read_config(config).get("assets")
            if value:
                candidates.append((f"'assets' in {config}", os.path.expanduser(str(value))))
        candidates.append(("the libero package", os.path.join(root, "assets")))
    tried = []
    for where, folder in candidates:
        missing = _missing(folder)
        if not missing:
            return os.path.abspath(folder)
        what = "no such folder" if not os.path.isdir(folder) else \
            "lacks " + ", ".join(m + "/" for m in missing)
        tried.append(f"{folder} ({where}: {what})")
    raise PluginNotFoundError(
        "environment 'libero' needs LIBERO's scene assets (~200 MB of meshes and "
        "textures; the pip package ships only BDDL files and initial states); looked at "
        f"{'; '.join(tried)}. Get them from LIBERO's source repository: git clone "
        f"{SOURCE_REPO}, then give the env config assets_path: "
        "<clone>/libero/libero/assets (or set 'assets' to that folder in "
        f"{config})")


def _ensure_config(root: str, assets: str) -> None:
    """Give LIBERO a config file before its import prompts for one on stdin."""
    if os.path.isfile(_config_file()):
        return
    import yaml

    folder = os.path.join(tempfile.gettempdir(), f"siirl-libero-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    paths = {"benchmark_root": root, "bddl_files": os.path.join(root, "bddl_files"),
             "init_states": os.path.join(root, "init_files"),
             "datasets": os.path.join(root, "..", "datasets"), "assets": assets}
    scratch = os.path.join(folder, f"config.yaml.{os.getpid()}")
    with open(scratch, "w", encoding="utf-8") as handle:
        yaml.safe_dump(paths, handle)
    os.replace(scratch, os.path.join(folder, "config.yaml"))  # atomic: processes race
    os.environ["LIBERO_CONFIG_PATH"] = folder


class LiberoEnv(ArmEnv):
    """LIBERO's task suites as an EmbodiedEnv (see the module docstring)."""

    def __init__(self, suites: Optional[Sequence[str]] = None,
                 tasks: Optional[Sequence[str]] = None, assets_path: Optional[str] = None,
                 camera: str = "agentview", image_size: int = 128,
                 max_steps: Optional[int] = None, settle_steps: int = 10,
                 renderer: Optional[str] = None, image_flip: str = "upright"):
        if isinstance(suites, str):
            suites = [suites]
        suites = list(suites or DEFAULT_SUITES)
        unknown = sorted(set(suites) - set(SUITES))
        if unknown:
            raise ConfigError(f"libero: no suite {', '.join(map(repr, unknown))}; there "
                              f"are: {', '.join(SUITES)}")
        every = [f"{s}/{i}" for s in suites for i in range(SUITES[s][0])]
        if isinstance(tasks, str):
            tasks = [tasks]
        unknown = sorted(set(tasks or ()) - set(every))
        if unknown:
            raise ConfigError(f"libero: no task {', '.join(map(repr, unknown))} in suites "
                              f"{', '.join(suites)} (ids are <suite>/<index>, e.g. "
                              f"{every[0]})")
        self._limits = {s: int(max_steps) if max_steps else SUITES[s][1] for s in suites}
        super().__init__(camera, image_size, max(self._limits.values()), image_flip)
        self.task_ids = list(tasks) if tasks else every
        self.settle_steps = int(settle_steps)
        root = _package_root()
        self.assets_path = find_assets(assets_path)
        _ensure_config(root, self.assets_path)
        import_robosuite(EXTRA, EXTRA, renderer)
        package = importlib.import_module("libero.libero")
        # LIBERO resolves assets through this cache; set, it never downloads
        package._assets_path_cache = self.assets_path
        self._benchmark = importlib.import_module("libero.libero.benchmark")
        self._envs = importlib.import_module("libero.libero.envs")
        self._suites: Dict[str, Any] = {}
        self._init_states: Dict[str, np.ndarray] = {}

    def _suite_task(self, task_id: str) -> Tuple[Any, int]:
        suite, _, index = task_id.partition("/")
        if suite not in self._suites:
            with contextlib.redirect_stdout(io.StringIO()):  # it prints the task order
                self._suites[suite] = self._benchmark.get_benchmark_dict()[suite]()
        return self._suites[suite], int(index)

    def _build(self, task_id: str) -> Any:
        suite, index = self._suite_task(task_id)
        libero = importlib.import_module("libero.libero")
        task = suite.get_task(index)
        bddl = os.path.join(libero.get_libero_path("bddl_files"), task.problem_folder,
                            task.bddl_file)
        if task_id not in self._init_states:
            self._init_states[task_id] = np.asarray(suite.get_task_init_states(index))
        return self._envs.OffScreenRenderEnv(
            bddl_file_name=bddl, camera_names=[self.camera], camera_heights=self.image_size,
            camera_widths=self.image_size, use_camera_obs=False,
            horizon=10 ** 6, ignore_done=True)  # episodes are counted here

    def _robot_env(self) -> Any:
        return self._sim.env  # LIBERO's ControlEnv wraps the robosuite environment

    def _begin(self, task_id: str, seed: int) -> Dict[str, Any]:
        self._sim.reset()
        states = self._init_states[task_id]
        raw = self._sim.set_init_state(states[seed % len(states)])
        for _ in range(self.settle_steps):
            raw, _, _, _ = self._sim.step(_IDLE)
        return raw

    def _instruction(self, task_id: str) -> str:
        suite, index = self._suite_task(task_id)
        return str(suite.get_task(index).language)

    def _limit(self, task_id: str) -> int:
        return self._limits[task_id.partition("/")[0]]
