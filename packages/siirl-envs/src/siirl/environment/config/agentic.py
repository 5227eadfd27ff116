"""The agentic sections of siirl-envs (``algorithm.workflow_type=AGENTIC``): ROLL's env
manager (``env_manager``: how episodes become training rows) and its rollout schedulers
(``train_env_manager`` / ``val_env_manager``), with the rule tying them to the rollout, and
the environments they play (``custom_envs``, by tag). Registered as ``siirl.config:
custom_envs``, ``env_manager`` and ``env_scheduler``; the agentic rollout reads them.
Nothing heavy is imported here: ``siirl-train --help`` reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from siirl.params.key_conditions import get
from siirl.params.sections import ConfigSection, Mount, size
from siirl.params.value_rules import at_least

R = "actor_rollout_ref.rollout"


@dataclass
class RewardNormalizationArguments:
    """ROLL's score normalization before advantages."""

    grouping: str = field(
        default="state", metadata={"help": "state: the episodes from one seed; batch: all."})
    method: str = field(
        default="identity", metadata={"help": "identity, mean (minus the group mean) or "
                                              "mean_std (also divided by its std)."})


@dataclass
class EnvManagerArguments:
    """How episodes become training rows (the trajectory-level env manager)."""

    mode: str = field(
        default="trajectory", metadata={"help": "trajectory: an episode is one sample (its "
                                                "replies trained, observations masked); "
                                                "step: each turn is one, scored by its "
                                                "discounted return."})
    gamma: float = field(
        default=1.0, metadata={"help": "mode=step: the discount of later turns' rewards."})
    tags: list[str] | None = field(
        default=None, metadata={"help": "custom_envs tags to train on (null: all of them); "
                                        "prompt rows take them in turn."})
    max_actions_per_traj: int = field(
        default=10, metadata={"help": "Agent turns per episode at most."})
    max_tokens_per_step: int | None = field(
        default=None, metadata={"help": "New tokens per agent turn (null: "
                                        "data.max_response_length)."})
    max_episode_tokens: int = field(
        default=1024, metadata={"help": "Prompt, replies and observations of one episode "
                                        "at most, in tokens."})
    format_penalty: float = field(
        default=-0.1, metadata={"help": "Reward added for a reply with no parsable action."})
    reward_normalization: RewardNormalizationArguments = field(
        default_factory=RewardNormalizationArguments)
    env_processes: int = field(
        default=0, metadata={"help": "Worker processes hosting the environments (0: in the "
                                     "training worker); a hung or crashed one ends only its "
                                     "episodes."})
    step_timeout_s: float = field(
        default=60.0, metadata={"help": "env_processes > 0: seconds a turn's environment "
                                        "steps may take before their process is restarted."})
    error_penalty: float = field(
        default=-1.0, metadata={"help": "Reward added when the environment fails; the "
                                        "episode ends."})


@dataclass
class RolloutSchedulerArguments:
    """ROLL's ``train_env_manager`` / ``val_env_manager``: which environments the episodes
    of training (validation) play, and how many a worker keeps in flight."""

    max_env_num_per_worker: int = field(
        default=0, metadata={"help": "Environments a worker keeps in flight at once (a new "
                                     "episode starts when one ends); 0: all of its episodes."})
    group_size: int | None = field(
        default=None, metadata={"help": "Episodes from one seed: must equal "
                                        "actor_rollout_ref.rollout.n for training; for "
                                        "validation it replaces val_kwargs.n (null: those)."})
    tags: list[str] | None = field(
        default=None, metadata={"help": "custom_envs tags played (null: env_manager.tags)."})
    num_groups_partition: list[int] | None = field(
        default=None, metadata={"help": "Share of the prompt rows (seed groups) per tag, in "
                                        "the order of tags (null: the tags in turn)."})


def scheduler_problems(config: Any) -> List[str]:
    """ROLL's scheduler sections: the training group size is rollout.n (the batch arithmetic
    counts on it), and a partition gives one share per tag."""
    problems = []
    group = size(config, "train_env_manager.group_size")
    n = size(config, f"{R}.n")
    if group is not None and n is not None and group != n:
        problems.append(f"train_env_manager.group_size={group} differs from {R}.n={n}: both "
                        "are the episodes started from one seed; set them equal (or leave "
                        "group_size unset)")
    for section in ("train_env_manager", "val_env_manager"):
        partition = get(config, f"{section}.num_groups_partition")
        tags = get(config, f"{section}.tags") or get(config, "env_manager.tags") or \
            list(get(config, "custom_envs") or {})
        if partition is None:
            continue
        partition = list(partition)
        if len(partition) != len(list(tags)) or any(int(v) < 0 for v in partition) or \
                sum(int(v) for v in partition) <= 0:
            problems.append(f"{section}.num_groups_partition={partition} needs one share >= 0 "
                            f"per tag ({list(tags)}), not all 0")
    return problems


def control_problems(config: Any) -> List[str]:
    """The learning controls of each custom_envs entry (action_words, reward) are valid."""
    from siirl.environment.text_controls import action_words, reward_kind
    from siirl.errors import ConfigError

    problems = []
    for tag, entry in dict(get(config, "custom_envs") or {}).items():
        if not hasattr(entry, "get"):
            continue
        for check in (action_words, reward_kind):
            try:
                check(tag, entry)
            except ConfigError as exc:
                problems.append(str(exc))
    return problems


# ROLL's layout {tag: {env_type, env_config, env_instruction}}: a free-form mapping whose
# tags the user names; the agentic rollouts build one environment per tag
# (siirl.environment.registry.envs_from_config)
CUSTOM_ENVS = ConfigSection(
    schema=dict[str, Any],
    mounts=(Mount("custom_envs", "agentic", after="profiler"),),
    metadata={
        "help": "AGENTIC environments by tag (ROLL's layout), a free-form dict: "
                "TAG: {env_type, env_config, env_instruction}.",
        "entries": {"env_type": "an installed environment (siirl.environments)",
                    "env_config": "the environment's own settings (a dict)",
                    "env_instruction": "the rules shown to the agent (optional)",
                    "action_words": "a control: the word the agent says -> the action the "
                                    "environment takes, e.g. {Left: Up, Up: Left} (optional)",
                    "reward": "env (default) or coin_flip: a control whose fair coin per "
                              "episode replaces every reward (optional)"},
        "example": "+custom_envs.Sok.env_type=sokoban "
                   "+custom_envs.Sok.env_config.dim_room=[6,6]"},
    constraints=control_problems,
)
# read by the AGENTIC workflow and the env-manager rollouts of custom workflows alike, so no
# selector: the keys apply wherever an env manager runs
ENV_MANAGER = ConfigSection(
    schema=EnvManagerArguments,
    mounts=(Mount("env_manager", "agentic", after="custom_envs"),),
    value_rules=(at_least(1, ("env_manager.max_actions_per_traj",
                              "env_manager.max_episode_tokens")),
                 at_least(1, "env_manager.max_tokens_per_step", " (or null)")),
)
ENV_SCHEDULER = ConfigSection(
    schema=RolloutSchedulerArguments,
    mounts=(Mount("train_env_manager", "agentic", after="env_manager"),
            Mount("val_env_manager", "agentic", after="train_env_manager")),
    constraints=scheduler_problems,
)
