"""Schema of the ``algorithm`` and ``trainer`` groups.

Key names and defaults follow verl's ``ppo_trainer.yaml`` (plus DAPO's
``algorithm.filter_groups``); siiRL-specific keys are marked as such.
"""

from dataclasses import dataclass, field

from siirl.params.listed_names import algorithm_registry
from siirl.params.rollout_correction import RolloutCorrectionArguments

# The values of trainer.device (auto: CUDA where the worker sees a GPU, else the CPU):
# siirl.execution.device resolves them, the validation pass (value_rules) checks them.
DEVICES = ("auto", "cuda", "cpu")


@dataclass
class KLCtrlArguments:
    """KL-penalty controller used when algorithm.use_kl_in_reward is set."""

    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class FilterGroupsArguments:
    """DAPO dynamic sampling: drop prompt groups whose metric has zero variance."""

    enable: bool = False
    metric: str | None = None  # e.g. acc, score, seq_reward, seq_final_reward
    max_num_gen_batches: int = 0  # <=0 means no limit
    on_exhausted: str = field(
        default="error",
        metadata={"help": "siiRL: when max_num_gen_batches runs out without enough groups: "
                          "error (verl) or warn (train on the groups collected)."},
    )


@dataclass
class EmbodiedSamplingArguments:
    """Embodied GRPO/SRPO: keep task groups whose success rate lies within the bounds."""

    filter_accuracy: bool = True
    accuracy_lower_bound: float = 0.1
    accuracy_upper_bound: float = 0.9
    metric: str = "complete"  # per-episode success field (0/1)


@dataclass
class PFPPOArguments:
    """Preference-feedback PPO sample reweighting."""

    reweight_method: str = "pow"  # pow | max_min | max_random
    weight_pow: float = 2.0


@dataclass
class AlgorithmArguments:
    """RL algorithm: advantage estimator, workflow, discounting, KL penalty, filtering."""

    # Values of siirl.execution.scheduler.enums.AdvantageEstimator, kept as plain strings.
    adv_estimator: str = field(
        default="grpo",
        metadata={"help": "Advantage estimator: {names}.",
                  "names": algorithm_registry("ADV_ESTIMATORS")},
    )
    # Values of siirl.execution.scheduler.enums.WorkflowType, kept as plain strings.
    workflow_type: str = field(
        default="DEFAULT",
        metadata={"help": "Built-in workflow: DEFAULT (GRPO, or PPO with gae), DAPO, EMBODIED."},
    )
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    weight_factor_in_cpgd: str = field(
        default="STD_weight",
        metadata={"help": "siiRL CPGD advantage weighting: {names_or}.",
                  "names": algorithm_registry("CPGD_WEIGHTS")},
    )
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"  # kl | abs | mse | low_var_kl | full
    kl_ctrl: KLCtrlArguments = field(default_factory=KLCtrlArguments)
    filter_groups: FilterGroupsArguments = field(default_factory=FilterGroupsArguments)
    embodied_sampling: EmbodiedSamplingArguments = field(
        default_factory=EmbodiedSamplingArguments)
    use_pf_ppo: bool = False
    pf_ppo: PFPPOArguments = field(default_factory=PFPPOArguments)
    rollout_correction: RolloutCorrectionArguments = field(
        default_factory=RolloutCorrectionArguments)


@dataclass
class TrainerArguments:
    """Training loop: epochs, cluster size, logging, validation and checkpointing."""

    # verl's default is true; siiRL never reorders a step's rows by length across workers,
    # so the default says what runs (true is reported as not applying: params/key_rules.py)
    balance_batch: bool = False
    total_epochs: int = field(default=8, metadata={"help": "Number of passes over train data."})
    total_training_steps: int | None = None
    project_name: str = field(
        default="siirl_examples", metadata={"help": "Project name for loggers and checkpoints."}
    )
    experiment_name: str = field(
        default="arithmetic_grpo", metadata={"help": "Run name for loggers and checkpoints."}
    )
    logger: list[str] = field(
        default_factory=lambda: ["console"],
        metadata={"help": "Metric loggers, e.g. [console,wandb,tensorboard]."},
    )
    log_val_generations: int = field(
        default=0, metadata={"help": "Validation samples printed at each validation."})
    rollout_data_dir: str | None = field(
        default=None, metadata={"help": "Folder for each step's generations (<step>.jsonl: "
                                        "input, output, score)."})
    validation_data_dir: str | None = field(
        default=None, metadata={"help": "Folder for each validation's generations "
                                        "(<step>.jsonl)."})
    nnodes: int = field(default=1, metadata={"help": "Number of nodes."})
    n_gpus_per_node: int = field(
        default=1, metadata={"help": "Workers (GPUs) per node; siiRL default is one worker."}
    )
    device: str = "auto"  # siiRL: one of DEVICES
    cpu_threads: int | None = field(
        default=1,
        metadata={"help": "torch intra-op threads per CPU worker; 1 is fastest for small "
                          "models on few cores, null keeps torch's default."},
    )
    save_freq: int = field(
        default=100, metadata={"help": "Checkpoint every N steps (-1 disables)."}
    )
    resume_mode: str = "auto"  # auto | disable | resume_path
    resume_from_path: str | None = None
    val_before_train: bool = True
    val_only: bool = field(
        default=False,
        metadata={"help": "Validate the loaded (or resumed) policy once and exit, no training."},
    )
    test_freq: int = field(default=50, metadata={"help": "Validate every N steps (-1 disables)."})
    val_greedy_and_sampled: bool = field(
        default=False,
        metadata={"help": "siiRL: validation also plays the set with the other decoding than "
                          "rollout.val_kwargs' and logs both under val/greedy/... and "
                          "val/sampled/... (val/... stays the val_kwargs decoding's)."},
    )
    critic_warmup: int = 0
    default_hdfs_dir: str | None = None
    del_local_ckpt_after_load: bool = False
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    max_actor_ckpt_to_keep: int | None = None
    max_critic_ckpt_to_keep: int | None = None
    ray_wait_register_center_timeout: int = 300
    profile_steps: list[int] | None = field(
        default=None, metadata={"help": "verl: the training steps to profile (turns "
                                        "profiler.enable on for them; see profiler.*)."})
    ray_address: str | None = field(
        default=None,
        metadata={"help": "Ray cluster to join for multi-worker runs: null joins RAY_ADDRESS "
                          "or the cluster `ray start` recorded on this machine, and else starts "
                          "a private one; 'local' always starts a private one (it stops with "
                          "the command). The first line of the run says which."},
    )
    ray_node_ip: str | None = field(
        default=None,
        metadata={"help": "This machine's address as the Ray cluster knows its nodes (what "
                          "`ray start --node-ip-address` was given): the driver joins with it. "
                          "Needed when that is a loopback address (a cluster on one machine) "
                          "or one of several interfaces; null lets Ray pick."},
    )
    ray_connect_timeout_s: float = field(
        default=30.0,
        metadata={"help": "Seconds to wait for the cluster at trainer.ray_address to answer "
                          "before the job stops naming the address."},
    )
    ray_temp_dir: str | None = field(
        default=None, metadata={"help": "Ray's session directory for a local cluster."}
    )
    dist_timeout_s: int = field(
        default=600,
        metadata={"help": "Seconds a collective (gloo/NCCL) may wait for a peer before the "
                          "worker fails instead of hanging."},
    )
    heartbeat_timeout_s: float = field(
        default=120.0,
        metadata={"help": "Seconds a worker of a multi-worker job may go without a heartbeat "
                          "(stopped, hung) before the job stops naming it."},
    )
    seed: int = 1  # siiRL: global random seed
