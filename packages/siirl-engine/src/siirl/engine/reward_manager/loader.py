"""Load the user's reward function from ``custom_reward_function.path`` / ``.name``.

Kept free of torch imports: the reward worker processes call it too, so the function is
loaded there by (path, name) instead of being pickled.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Tuple

from siirl.errors import ConfigError
from siirl.user_file import UserFile, defined_names, import_file, load_from_file

# The per-call timeout of the reward managers; never passed to the user function.
TIMEOUT_KWARG = "timeout_s"
CUSTOM_FUNCTION_FILE = UserFile(key="custom_reward_function.path", prefix="siirl_custom_reward_",
                                kind="function", name_key="custom_reward_function.name")


def load_custom_function(path: str, name: str = "compute_score") -> Callable[..., Any]:
    """Import ``path`` as a module and return its callable ``name``."""
    fn = load_from_file(path, name, CUSTOM_FUNCTION_FILE)
    if not callable(fn):
        module = import_file(path, name, CUSTOM_FUNCTION_FILE)  # loaded: the same module
        raise ConfigError(
            f"custom_reward_function.name '{name}' is not a function in '{path}' "
            f"(functions there: {', '.join(defined_names(module)) or 'none'})")
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
