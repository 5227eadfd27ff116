"""Value constraints that tie one key to another, checked when the configuration is parsed.

The schema catches unknown keys and wrong types; ``key_support`` catches keys this release
would ignore. A value that is well typed but impossible together with another key (a buffer
longer than the response it shapes) is caught here, so the run stops before any model loads,
with one ``ConfigError`` naming the key, its value and the constraint. The engines keep their
own checks for configurations built without the parser.
"""

from __future__ import annotations

from typing import Any, Callable, List

from omegaconf import OmegaConf

from siirl.errors import ConfigError

_OVERLONG = "reward_model.overlong_buffer"


def _overlong_buffer_fits(config: Any) -> None:
    if not OmegaConf.select(config, f"{_OVERLONG}.enable"):
        return
    length = OmegaConf.select(config, f"{_OVERLONG}.len")
    max_len = OmegaConf.select(config, "data.max_response_length")
    if max_len is None or not 1 <= int(length or 0) <= int(max_len):
        raise ConfigError(
            f"{_OVERLONG}.len={length} must be in 1..data.max_response_length ({max_len}) "
            f"when {_OVERLONG}.enable is set: the penalty ramps over the last len tokens a "
            "response may have (lower the buffer, or raise data.max_response_length)")


CHECKS: List[Callable[[Any], None]] = [_overlong_buffer_fits]


def check_constraints(config: Any) -> None:
    """Raise ``ConfigError`` for the first constraint ``config`` breaks."""
    for check in CHECKS:
        check(config)
