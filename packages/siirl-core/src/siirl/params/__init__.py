"""Structured (dataclass) configuration schema of siiRL.

``SiiRLArguments`` is the root; ``OmegaConf.structured(SiiRLArguments)`` yields a config
whose key names and defaults follow verl's ``ppo_trainer.yaml``, plus the siiRL ``dag``
group. The schema holds no behaviour: parsing, merging and validation live elsewhere.

The sections of backends, rollouts and environments are not defined here: their packages
register them under the entry point group ``siirl.config`` and they are mounted below when
this package is imported (``siirl.params.sections``, ``siirl.params.compose``).
"""

from dataclasses import dataclass, field
from typing import Any

from siirl.params.sections import installed_sections

# ruff: noqa: E402 -- the sections are read before the schema below exists, so a section
# that imports it fails clearly instead of capturing the classes before its own is mounted
_SECTIONS = installed_sections()

from siirl.params.agentic_args import (
    EnvManagerArguments,
    RewardNormalizationArguments,
    RolloutSchedulerArguments,
)
from siirl.params.dag_args import DagArguments
from siirl.params.data_args import CustomClsArguments, DataArguments, SamplerArguments
from siirl.params.embodied_args import EmbodiedArguments, EmbodiedEnvironmentArguments
from siirl.params.model_args import (
    ActorArguments,
    ActorRolloutRefArguments,
    AgentRolloutArguments,
    CheckpointArguments,
    CriticArguments,
    CriticModelArguments,
    ModelArguments,
    MultiTurnArguments,
    OptimArguments,
    PolicyLossArguments,
    RefArguments,
    RolloutArguments,
    ValKwargsArguments,
)
from siirl.params.profiler_args import ProfilerArguments
from siirl.params.reward_args import (
    CustomRewardFunctionArguments,
    GenerativeJudgeArguments,
    OverlongBufferArguments,
    RewardLoopRolloutArguments,
    RewardManagerArguments,
    RewardManagerModuleArguments,
    RewardModelArguments,
    RewardModelModelArguments,
    RewardModelProfilerArguments,
    SandboxFusionArguments,
)
from siirl.params.training_args import (
    AlgorithmArguments,
    EmbodiedSamplingArguments,
    FilterGroupsArguments,
    KLCtrlArguments,
    PFPPOArguments,
    TrainerArguments,
)


@dataclass
class SiiRLArguments:
    """Root siiRL training configuration (verl-compatible keys plus the dag group)."""

    algorithm: AlgorithmArguments = field(default_factory=AlgorithmArguments)
    data: DataArguments = field(default_factory=DataArguments)
    actor_rollout_ref: ActorRolloutRefArguments = field(default_factory=ActorRolloutRefArguments)
    critic: CriticArguments = field(default_factory=CriticArguments)
    reward_model: RewardModelArguments = field(default_factory=RewardModelArguments)
    custom_reward_function: CustomRewardFunctionArguments = field(
        default_factory=CustomRewardFunctionArguments
    )
    reward_manager: RewardManagerArguments = field(default_factory=RewardManagerArguments)
    trainer: TrainerArguments = field(default_factory=TrainerArguments)
    dag: DagArguments = field(default_factory=DagArguments)
    profiler: ProfilerArguments = field(default_factory=ProfilerArguments)  # siiRL
    # AGENTIC: {tag: {env_type, env_config}} (ROLL's layout) and the env manager
    custom_envs: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "AGENTIC environments by tag (ROLL's layout), a free-form dict: "
                "TAG: {env_type, env_config, env_instruction}.",
        "entries": {"env_type": "an installed environment (siirl.environments)",
                    "env_config": "the environment's own settings (a dict)",
                    "env_instruction": "the rules shown to the agent (optional)"},
        "example": "+custom_envs.Sok.env_type=sokoban "
                   "+custom_envs.Sok.env_config.dim_room=[6,6]"})
    env_manager: EnvManagerArguments = field(default_factory=EnvManagerArguments)
    # ROLL's rollout schedulers of training and validation episodes
    train_env_manager: RolloutSchedulerArguments = field(
        default_factory=RolloutSchedulerArguments)
    val_env_manager: RolloutSchedulerArguments = field(
        default_factory=RolloutSchedulerArguments)


def _mount_installed_sections() -> None:
    from siirl.params.compose import compose_schema

    rebuilt = compose_schema(SiiRLArguments, _SECTIONS)
    for name, value in list(globals().items()):
        if isinstance(value, type) and value in rebuilt:
            globals()[name] = rebuilt[value]


_mount_installed_sections()

__all__ = [
    "ActorArguments",
    "ActorRolloutRefArguments",
    "AlgorithmArguments",
    "EmbodiedArguments",
    "EmbodiedEnvironmentArguments",
    "EmbodiedSamplingArguments",
    "CheckpointArguments",
    "CriticArguments",
    "CriticModelArguments",
    "CustomClsArguments",
    "CustomRewardFunctionArguments",
    "DagArguments",
    "DataArguments",
    "EnvManagerArguments",
    "FilterGroupsArguments",
    "GenerativeJudgeArguments",
    "KLCtrlArguments",
    "ModelArguments",
    "AgentRolloutArguments",
    "MultiTurnArguments",
    "RolloutSchedulerArguments",
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
    "RewardModelModelArguments",
    "RewardModelProfilerArguments",
    "RewardNormalizationArguments",
    "RolloutArguments",
    "SamplerArguments",
    "SandboxFusionArguments",
    "SiiRLArguments",
    "TrainerArguments",
    "ValKwargsArguments",
]
