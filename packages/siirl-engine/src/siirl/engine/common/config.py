"""Typed configuration at the engine boundary.

The launcher hands engines the run's configuration already typed (``SiiRLArguments``,
built once by ``siirl.params.typed.to_typed``); :func:`typed_config` is that same
conversion, for callers (tests, tools) that hold a dict or a DictConfig. Engines read
attributes whose defaults live in one place, the schema.
"""

from __future__ import annotations

from siirl.params import SiiRLArguments
from siirl.params.typed import to_typed as typed_config

__all__ = ["run_seed", "typed_config"]


def run_seed(cfg: SiiRLArguments) -> int:
    """The run's seed: ``trainer.seed``, else ``data.seed``."""
    return int(cfg.trainer.seed or cfg.data.seed or 0)
