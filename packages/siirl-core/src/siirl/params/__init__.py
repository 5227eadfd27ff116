"""Structured (dataclass) configuration schema of siiRL.

``SiiRLArguments`` is the root; ``OmegaConf.structured(SiiRLArguments)`` yields a config
whose key names and defaults follow verl's ``ppo_trainer.yaml``, plus the siiRL ``dag``
group. The schema holds no behaviour: parsing, merging and validation live elsewhere.

The sections of backends, rollouts and environments are not defined here: their packages
register them under the entry point group ``siirl.config`` (``siirl.params.sections``).
The schema is composed from core's groups and the installed sections the first time one of
the names below is read (``siirl.params.compose``): so a section's own module may import
``siirl.params.sections`` and the rule modules without composing it. The classes the
sections mount into are rebuilt here; import them from ``siirl.params``, not from the
modules that define core's part (``model_args``, ...).
"""

from typing import Any

from siirl.params import (
    dag_args,
    data_args,
    model_args,
    profiler_args,
    reward_args,
    root_args,
    training_args,
)

_SCHEMA_MODULES = (dag_args, data_args, model_args, profiler_args, reward_args, root_args,
                   training_args)
_composing = False


def _compose() -> None:
    """Mount the installed sections and bind every schema name here (once)."""
    global _composing
    from siirl.params.compose import compose_schema
    from siirl.params.sections import installed_sections

    if _composing:
        raise ImportError("siirl.params' schema is being composed from the config sections "
                          "(siirl.config): a section's module must not import it; keep the "
                          "section in a light module of its own (as siirl.engine.fsdp.config)")
    _composing = True
    try:
        rebuilt = compose_schema(root_args.SiiRLArguments, installed_sections())
    finally:
        _composing = False
    for module in _SCHEMA_MODULES:
        for name in __all__:
            value = getattr(module, name, None)
            if isinstance(value, type):
                globals()[name] = rebuilt.get(value, value)


def __getattr__(name: str) -> Any:
    if name in __all__:
        _compose()
        return globals()[name]
    raise AttributeError(f"module 'siirl.params' has no attribute {name!r}")


__all__ = [
    "ActorArguments",
    "ActorRolloutRefArguments",
    "AlgorithmArguments",
    "AsyncTrainingArguments",
    "EmbodiedSamplingArguments",
    "CheckpointArguments",
    "CriticArguments",
    "CriticModelArguments",
    "CustomClsArguments",
    "CustomRewardFunctionArguments",
    "DagArguments",
    "DataArguments",
    "FilterGroupsArguments",
    "KLCtrlArguments",
    "ModelArguments",
    "AgentRolloutArguments",
    "OptimArguments",
    "OverlongBufferArguments",
    "PFPPOArguments",
    "PolicyLossArguments",
    "ProfilerArguments",
    "RefArguments",
    "RewardLoopRolloutArguments",
    "RewardManagerArguments",
    "RewardManagerModuleArguments",
    "RewardModelArguments",
    "RewardModelProfilerArguments",
    "RolloutArguments",
    "RolloutCorrectionArguments",
    "RolloutPoolArguments",
    "RouterReplayArguments",
    "SamplerArguments",
    "SandboxFusionArguments",
    "SiiRLArguments",
    "TrainerArguments",
    "ValKwargsArguments",
]
