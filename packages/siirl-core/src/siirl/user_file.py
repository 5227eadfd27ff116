"""A Python file of the user's, imported as a module: a reward function
(``custom_reward_function.path``), a reward manager class (``reward_manager.module.path``),
an agent's hooks and environment (``agent_options.process_path`` / ``env_path``).

One way for all of them, so each refuses a bad file with the same one-paragraph error that
names the config key, the file and the name looked for:

* the module is registered in ``sys.modules`` before its code runs (dataclasses and pickle
  look classes up through ``sys.modules[cls.__module__]``) under a name derived from the
  file's absolute path, so every import of one file in a process gets one module, and a
  worker process that loads the same file gets the same module name;
* an exception, or a ``sys.exit``, while the file runs is the user's error, not the end of
  the run: it is raised as ``error`` (``ConfigError`` unless the caller says otherwise).

Free of torch and of the rest of core: reward worker processes import it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, List, Optional, Type

from siirl.errors import ConfigError

FILE_PREFIX = "file://"


@dataclass(frozen=True)
class UserFile:
    """Where a file was named and what is wanted from it, for the errors.

    ``key`` is the config key whose value is the path (``custom_reward_function.path``, or
    ``node 'a' agent_options.process_path``); ``kind`` and ``name_key`` describe the object
    looked up in the file ("function", "class"; the key that names it, if any); ``prefix``
    starts the derived module name; ``hint`` ends the import and lookup errors.
    """

    key: str
    prefix: str
    kind: str = "object"
    name_key: Optional[str] = None
    hint: str = ""
    error: Type[Exception] = ConfigError


def resolve(path: str) -> str:
    """The absolute file a path names (``file://`` prefix and ``~`` allowed)."""
    path = str(path)
    if path.startswith(FILE_PREFIX):
        path = path[len(FILE_PREFIX):]
    return os.path.abspath(os.path.expanduser(path))


def import_file(path: str, wanted: str, where: UserFile, module_name: Optional[str] = None,
                module_name_key: str = "module name") -> ModuleType:
    """Import ``path`` as a module (once per process) for its ``wanted`` object.

    ``module_name`` is the name it gets in ``sys.modules`` (None: ``where.prefix`` and a
    digest of the absolute path); a name another file already holds is refused, naming
    ``module_name_key``.
    """
    file = resolve(path)
    label = f"{where.key}={str(path)!r}"
    looking_for = _described(wanted, where)
    if not os.path.isfile(file):
        raise where.error(f"{label} is not a file (resolved to '{file}'); it should be a .py "
                          f"file defining the {looking_for}")
    name = module_name or where.prefix + hashlib.sha1(file.encode()).hexdigest()[:12]
    loaded = sys.modules.get(name)
    if loaded is not None:
        if os.path.abspath(getattr(loaded, "__file__", "") or "") == file:
            return loaded
        raise where.error(f"{module_name_key}={name!r} is already the name of another module "
                          f"({getattr(loaded, '__file__', None) or 'built in'}); choose "
                          f"another name for {path}, or null")
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise where.error(f"{label} cannot be imported as a Python module (looking for the "
                          f"{looking_for})")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # an exit at import must not end the run
        sys.modules.pop(name, None)
        raise where.error(f"{label} failed to import while looking for the {looking_for}: "
                          f"{type(exc).__name__}: {exc}{_hint(where)}") from exc
    return module


def load_from_file(path: str, wanted: str, where: UserFile, **module_options: Any) -> Any:
    """The object ``wanted`` defined in the file ``path`` (see ``import_file``)."""
    module = import_file(path, wanted, where, **module_options)
    if not hasattr(module, wanted):
        defined = ", ".join(defined_names(module)) or "no public function or class"
        raise where.error(f"{where.key}={str(path)!r} defines no {_described(wanted, where)}; "
                          f"it defines {defined}{_hint(where)}")
    return getattr(module, wanted)


def defined_names(module: ModuleType) -> List[str]:
    """The public functions and classes the file itself defines (not those it imports)."""
    return sorted(key for key, value in vars(module).items()
                  if callable(value) and not key.startswith("_")
                  and getattr(value, "__module__", None) == module.__name__)


def _described(wanted: str, where: UserFile) -> str:
    named_by = f" ({where.name_key})" if where.name_key else ""
    return f"{where.kind} {wanted!r}{named_by}"


def _hint(where: UserFile) -> str:
    return f". {where.hint}" if where.hint else ""
