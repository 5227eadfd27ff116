"""Read a dotted key from whatever config object a caller holds."""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf


def select(config: Any, key: str, default: Any = None) -> Any:
    """``select(cfg, "algorithm.adv_estimator")`` for a DictConfig, a dict, a dataclass or
    None; a missing key or a None value gives ``default``."""
    if config is None:
        return default
    if isinstance(config, DictConfig):
        value = OmegaConf.select(config, key, default=default)
        return default if value is None else value
    node = config
    for part in key.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        elif dataclasses.is_dataclass(node) or hasattr(node, part):
            node = getattr(node, part, None)
        else:
            return default
        if node is None:
            return default
    return node
