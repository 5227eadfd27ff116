"""Agentic RL settings (``algorithm.workflow_type=AGENTIC``): ROLL's ``custom_envs`` and the
trajectory env manager's limits."""

from dataclasses import dataclass, field


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
