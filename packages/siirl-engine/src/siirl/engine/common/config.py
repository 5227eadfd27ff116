"""Typed configuration at the engine boundary.

Engines are handed the run's configuration as whatever the caller holds (the CLI's
DictConfig, a dict in tests); :func:`typed_config` turns it, once, into the schema's
dataclasses (``siirl.params.SiiRLArguments``), so engines read attributes whose defaults
live in one place, the schema, instead of ``select(config, "a.b.c", default)`` calls whose
defaults drift apart.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from siirl.params import SiiRLArguments


def typed_config(config: Any) -> SiiRLArguments:
    """``config`` (None, a dict, a DictConfig, or already typed) as ``SiiRLArguments``:
    missing keys take the schema's defaults, interpolations are resolved."""
    if isinstance(config, SiiRLArguments):
        return config
    if isinstance(config, DictConfig) and OmegaConf.get_type(config) is SiiRLArguments:
        return OmegaConf.to_object(config)
    schema = OmegaConf.structured(SiiRLArguments)
    return OmegaConf.to_object(schema if config is None else OmegaConf.merge(schema, config))


def run_seed(cfg: SiiRLArguments) -> int:
    """The run's seed: ``trainer.seed``, else ``data.seed``."""
    return int(cfg.trainer.seed or cfg.data.seed or 0)
