"""verl's ``reward_manager.source=importlib``: a reward manager class of the user's own,
loaded from a file and registered in ``siirl.reward_managers`` like an installed one.

``reward_manager.module.path`` names the file (``file://`` prefix allowed) or, as
``pkg://dotted.module``, an importable module; ``reward_manager.name`` the class in it;
``reward_manager.module.name`` the name the file's module gets in ``sys.modules`` (null: a
name derived from the path). The parser has made ``reward_model.reward_manager`` that class
name (``siirl.params.aliases``), so the worker builds it as it builds ``naive``:
``Cls(role="reward", config=..., worker=..., peers=...)``, scoring with
``compute_reward(batch) -> NodeOutput``; subclassing ``siirl.engine.reward_manager.
RewardManagerBase`` (implement ``_score_rows``) gives decoding, score placement, the
overlong penalty, the reward model's scores and the metrics. verl's own managers (an
``AbstractRewardManager`` called on a ``DataProto``) import verl and cannot run here.

Every worker process loads the file itself when it builds its engines, as it imports an
installed manager's entry point.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, Optional, Tuple

from siirl.errors import ConfigError, PluginNotFoundError
from siirl.plugins import load_plugin, register
from siirl.user_file import UserFile, load_from_file

GROUP = "siirl.reward_managers"
SOURCE, NAME = "reward_manager.source", "reward_manager.name"
PATH, MODULE_NAME = "reward_manager.module.path", "reward_manager.module.name"
PKG = "pkg://"
VERL_HINT = ("verl's reward managers (an AbstractRewardManager called on a DataProto) do "
             "not run here: write the class as a subclass of siirl.engine.reward_manager."
             "RewardManagerBase (its _score_rows gets each row's data_source, decoded "
             "response, ground truth and extra_info), or keep a registered manager and put "
             "the scoring in custom_reward_function.path")
MANAGER_FILE = UserFile(key=PATH, prefix="siirl_reward_manager_", kind="class", name_key=NAME,
                        hint=VERL_HINT)

# (path, module name, class name) -> the class, so every lookup in a process gets one object
_LOADED: Dict[Tuple[str, Optional[str], str], Any] = {}


def from_file(config: Any) -> bool:
    return config.reward_manager.source == "importlib"


def register_file_reward_manager(config: Any) -> Optional[str]:
    """With ``reward_manager.source=importlib``: load the class, register it under its name
    in ``siirl.reward_managers`` for this process and return that name (else None)."""
    if not from_file(config):
        return None
    manager = config.reward_manager
    class_name, path = manager.name, manager.module.path
    if not class_name or not path:
        raise ConfigError(f"{SOURCE}=importlib needs {NAME} (the class) and {PATH} (its "
                          f"file); got {NAME}={class_name!r}, {PATH}={path!r}")
    class_name, path = str(class_name), str(path)
    module_name = manager.module.name
    key = (path, None if module_name is None else str(module_name), class_name)
    if key not in _LOADED:
        cls = _load_class(path, key[1], class_name)
        _check_class(cls, class_name, path)
        _LOADED[key] = cls
    cls = _LOADED[key]
    try:
        installed = load_plugin(GROUP, class_name)
    except PluginNotFoundError:
        installed = None
    if installed is not None and installed is not cls:
        raise ConfigError(f"{NAME}={class_name!r} with {SOURCE}=importlib names the class in "
                          f"{path}, but '{class_name}' is already a reward manager "
                          f"({getattr(installed, '__module__', '?')}): rename the class")
    register(GROUP, class_name)(cls)
    return class_name


def _load_class(path: str, module_name: Optional[str], class_name: str) -> Any:
    if path.startswith(PKG):
        dotted = path[len(PKG):].replace("/", ".")
        try:
            module = importlib.import_module(dotted)
        except Exception as exc:
            raise ConfigError(f"{PATH}={path!r}: importing {dotted} raised "
                              f"{type(exc).__name__}: {exc}. {VERL_HINT}") from exc
        cls = getattr(module, class_name, None)
        if cls is None:
            raise ConfigError(f"{NAME}={class_name!r}: {path} defines no such class "
                              f"({SOURCE}=importlib loads {NAME} from {PATH})")
        return cls
    return load_from_file(path, class_name, MANAGER_FILE, module_name=module_name,
                          module_name_key=MODULE_NAME)


def _check_class(cls: Any, class_name: str, path: str) -> None:
    if not callable(cls) or (isinstance(cls, type) and
                             not callable(getattr(cls, "compute_reward", None))):
        raise ConfigError(f"{NAME}={class_name!r} in {path} has no compute_reward(batch): a "
                          f"reward manager here is built as {class_name}(role=..., config=..., "
                          f"worker=...) and scores with compute_reward(batch). {VERL_HINT}")
