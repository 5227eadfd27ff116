"""The job's configuration: schema defaults, then a preset YAML, then ``key=value`` overrides.

Kept apart from the CLI so that a script or a test can build the same configuration
``siirl-train`` would, without going through argv.
"""

from __future__ import annotations

from typing import Any, List, Optional


def load_config(overrides: List[str], config_file: Optional[str] = None) -> Any:
    """Validated configuration: every unknown key, wrong type, value out of range or
    inconsistent pair of keys is listed in one ConfigError (siirl/params/validation.py)."""
    from siirl.params.parser import parse_config  # hydra is heavy: only when a job starts

    return parse_config(overrides, config_file, validate=True)


def format_config(config: Any) -> str:
    """The resolved configuration as YAML (``--print-config``)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(config)
