"""Load the user's reward function from ``custom_reward_function.path`` / ``.name``.

Kept free of torch imports: the reward worker processes call it too, so the function is
loaded there by (path, name) instead of being pickled.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from typing import Any, Callable, Dict, Optional, Tuple

from siirl.errors import ConfigError

# The per-call timeout of the reward managers; never passed to the user function.
TIMEOUT_KWARG = "timeout_s"


def load_custom_function(path: str, name: str = "compute_score") -> Callable[..., Any]:
    """Import ``path`` as a module and return its callable ``name``."""
    resolved = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(resolved):
        raise ConfigError(
            f"custom_reward_function.path '{path}' is not a file (resolved to '{resolved}'); "
            f"it should be a .py file defining '{name}'")
    # One module name per file path, registered in sys.modules before it runs, because
    # dataclasses and pickle look classes up through sys.modules[cls.__module__].
    digest = hashlib.sha1(resolved.encode()).hexdigest()[:12]
    module_name = f"siirl_custom_reward_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, resolved)
        if spec is None or spec.loader is None:
            raise ConfigError(f"custom_reward_function.path '{path}' cannot be imported "
                              f"as a Python module (looking for '{name}')")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:  # an exit at import must not end the run
            sys.modules.pop(module_name, None)
            raise ConfigError(
                f"custom_reward_function.path '{path}' failed to import while looking for "
                f"'{name}': {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items()
                       if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == module_name)
        raise ConfigError(
            f"custom_reward_function.name '{name}' is not a function in '{path}' "
            f"(functions there: {', '.join(found) or 'none'})")
    return fn


def custom_function_settings(
    config: Any,
) -> Tuple[Optional[str], str, Dict[str, Any], Optional[float]]:
    """``(path, name, reward_kwargs, timeout_s)`` from ``custom_reward_function``.

    ``path`` is absolute (worker processes may run elsewhere) or None; ``timeout_s`` is
    taken out of ``reward_kwargs`` because it configures the manager, not the function.
    """
    from siirl.engine.common.config import typed_config  # omegaconf: not for the workers

    settings = typed_config(config).custom_reward_function
    path, name = settings.path, str(settings.name or "compute_score")
    kwargs = dict(settings.reward_kwargs or {})
    timeout = kwargs.pop(TIMEOUT_KWARG, None)
    if timeout is not None:
        try:
            timeout = float(timeout)
        except (TypeError, ValueError):
            raise ConfigError(f"custom_reward_function.reward_kwargs.{TIMEOUT_KWARG}="
                              f"{timeout!r} must be a number of seconds") from None
    if path:
        path = os.path.abspath(os.path.expanduser(str(path)))
    return path or None, name, kwargs, timeout
