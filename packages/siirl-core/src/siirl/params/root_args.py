"""The root of core's schema, before the installed config sections are mounted on it
(``siirl.params.compose``); import ``SiiRLArguments`` from ``siirl.params``, which is the
composed one."""

from dataclasses import dataclass, field

from siirl.params.async_args import AsyncTrainingArguments, RolloutPoolArguments
from siirl.params.dag_args import DagArguments
from siirl.params.data_args import DataArguments
from siirl.params.model_args import ActorRolloutRefArguments, CriticArguments
from siirl.params.profiler_args import ProfilerArguments
from siirl.params.reward_args import (
    CustomRewardFunctionArguments,
    RewardManagerArguments,
    RewardModelArguments,
)
from siirl.params.training_args import AlgorithmArguments, TrainerArguments


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
    async_training: AsyncTrainingArguments = field(default_factory=AsyncTrainingArguments)
    rollout: RolloutPoolArguments = field(default_factory=RolloutPoolArguments)  # async pool
    # siirl-envs mounts custom_envs (AGENTIC environments by tag), the env manager and its
    # schedulers after it (siirl.environment.config.agentic)
