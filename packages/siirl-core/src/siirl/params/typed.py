"""The run's configuration as the schema's dataclasses, built once by the launcher.

``siirl-train`` composes a DictConfig (``siirl.params.parser.parse_config``); the launcher
turns it into ``SiiRLArguments`` with :func:`to_typed` before any worker, node, engine or
environment sees it, so they all read attributes whose defaults live in one place, the
dataclass fields. Free-form groups (``custom_envs``, ``override_config``,
``reward_kwargs``, ...) stay plain dicts. The object pickles as it is (Ray actors).
"""

from __future__ import annotations

from typing import Any

from siirl.params import SiiRLArguments


def to_typed(config: Any = None) -> SiiRLArguments:
    """``config`` (None, a dict, a DictConfig, or already typed) as ``SiiRLArguments``:
    keys it does not set take the schema's defaults, interpolations are resolved. An
    object already typed is returned as it is."""
    if isinstance(config, SiiRLArguments):
        return config
    from omegaconf import DictConfig, OmegaConf  # not needed once typed (the workers)

    if isinstance(config, DictConfig) and OmegaConf.get_type(config) is SiiRLArguments:
        return OmegaConf.to_object(config)
    from siirl.params.aliases import canonical_backend_names

    merged = OmegaConf.structured(SiiRLArguments)
    if config is not None:
        merged = OmegaConf.merge(merged, config)
        canonical_backend_names(merged)  # as siirl-train's parser does: strategy=fsdp2 is fsdp
    return OmegaConf.to_object(merged)


def to_section(cls: type, values: Any = None) -> Any:
    """``values`` (None, a dict, a DictConfig, or already a ``cls``) as the section dataclass
    ``cls`` (e.g. ``ActorArguments`` for a policy loss called on its own): keys it does not
    set take the dataclass's defaults."""
    if isinstance(values, cls):
        return values
    from omegaconf import OmegaConf

    schema = OmegaConf.structured(cls)
    return OmegaConf.to_object(schema if values is None else OmegaConf.merge(schema, values))
