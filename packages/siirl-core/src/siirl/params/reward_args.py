"""Schema of the reward groups: ``reward_model`` (managers, limits, the overlong buffer,
sandbox fusion, the reward model and its judge) and ``custom_reward_function``; key names
and defaults follow verl's, except siiRL's ``style``, ``rm_weight`` and ``judge.*``. The reward
model's own sections (``reward_model.model``, ``reward_model.judge``) are siirl-engine's
(``siirl.engine.reward_model.config``)."""

from dataclasses import dataclass, field
from typing import Any

from siirl.params.listed_names import plugin_group

# --- reward_model / custom_reward_function ---


@dataclass
class SandboxFusionArguments:
    """Remote code-execution sandbox used by code reward functions."""

    url: str | None = None
    max_concurrent: int = 64
    memory_limit_mb: int = 1024


@dataclass
class OverlongBufferArguments:
    """DAPO soft overlong punishment for responses near the length limit."""

    enable: bool = False
    len: int = 0
    penalty_factor: float = 0.0
    log: bool = False


@dataclass
class RewardLoopRolloutArguments:
    """verl's ``reward_model.rollout``: the inference server its reward loop serves the
    reward model with (defaults are verl's; ``name`` is required there)."""

    name: str | None = None
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    cudagraph_capture_sizes: Any = None  # a list of batch sizes, or null
    free_cache_engine: bool = True
    data_parallel_size: int = 1
    expert_parallel_size: int = 1
    tensor_model_parallel_size: int = 2
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    max_num_seqs: int = 1024
    load_format: str = "auto"
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    limit_images: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    disable_log_stats: bool = True
    skip_tokenizer_init: bool = False
    prompt_length: int = 2048
    response_length: int = 2048


@dataclass
class RewardModelProfilerArguments:
    """verl's per-role ``reward_model.profiler`` (nsys/npu/torch around the reward model)."""

    tool: str | None = None
    enable: bool = False
    all_ranks: bool = False
    ranks: list[Any] = field(default_factory=list)  # worker ranks to profile
    save_path: str | None = None
    tool_config: Any = None  # the tool's own settings (a mapping), or null


@dataclass
class RewardModelArguments:
    """Reward computation: reward manager, optional reward model, DAPO overlong buffer."""

    enable: bool = field(
        default=False, metadata={"help": "Score responses with a reward model too: each row's "
                                         "reward is its rule score plus rm_weight times the "
                                         "model's."}
    )
    # the training backend of the reward model (names from siirl.engines, as the actor's)
    strategy: str = field(default="fsdp", metadata={"names": plugin_group("siirl.engines")})
    # siiRL's keys: how the model scores, and its weight against the rule scores
    style: str = field(
        default="discriminative",
        metadata={"help": "'discriminative': a sequence classifier (model.path, e.g. "
                          "builtin:tiny-reward) scores each response; 'generative': an LLM "
                          "judge grades it (see judge.*)."}
    )
    rm_weight: float = field(
        default=1.0, metadata={"help": "Weight of the reward model's score added to the rule "
                                       "score (rows without a rule: the model's alone)."}
    )
    micro_batch_size: int | None = None  # deprecated
    micro_batch_size_per_gpu: int | None = None
    max_length: int | None = None
    ulysses_sequence_parallel_size: int = 1
    use_dynamic_bsz: bool = "${critic.use_dynamic_bsz}"
    forward_max_token_len_per_gpu: int = "${critic.forward_max_token_len_per_gpu}"
    reward_manager: str = field(
        default="naive", metadata={"help": "Reward manager: {names} (a name in the "
                                           "siirl.reward_managers plugin group).",
                                   "names": plugin_group("siirl.reward_managers")}
    )
    # the manager's own keywords (verl's key): the embodied manager reads reward_coef
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    launch_reward_fn_async: bool = False
    # A user reward function runs in worker processes; a failing sample scores 0.0. These
    # bound a step's reward time and how long a run goes on with no scored sample.
    max_failed_steps: int = field(
        default=3, metadata={"help": "Stop the run after this many consecutive steps in "
                                     "which every reward failed (0: never stop)."}
    )
    step_timeout_s: float = field(
        default=600.0, metadata={"help": "Seconds a step's rewards may take in all; samples "
                                         "not scored by then score 0.0 (per call: "
                                         "custom_reward_function.reward_kwargs.timeout_s)."}
    )
    sandbox_fusion: SandboxFusionArguments = field(default_factory=SandboxFusionArguments)
    overlong_buffer: OverlongBufferArguments = field(default_factory=OverlongBufferArguments)
    # verl's reward loop (its default since late 2025; every verl reward-model script sets
    # use_reward_loop): how verl *runs* the scoring. Key rules say what each does here.
    use_reward_loop: bool = True
    num_workers: int | None = field(
        default=None, metadata={"help": "Scoring processes of reward_manager=parallel "
                                        "(verl: reward-loop workers; null: min(4, CPUs))."}
    )
    enable_resource_pool: bool = False
    n_gpus_per_node: int = 8
    nnodes: int = 0
    reward_loop_source: str = "register"
    reward_loop_module_path: str | None = None
    reward_loop_class_name: str | None = None
    rollout: RewardLoopRolloutArguments = field(default_factory=RewardLoopRolloutArguments)
    profiler: RewardModelProfilerArguments = field(
        default_factory=RewardModelProfilerArguments)


@dataclass
class RewardManagerModuleArguments:
    """verl's ``reward_manager.module``: the file a reward manager class is loaded from."""

    path: str | None = field(
        default=None, metadata={"help": "Python file holding the class reward_manager.name "
                                        "(file://... or a plain path), or pkg://dotted.module "
                                        "(read with reward_manager.source=importlib)."}
    )
    name: str | None = field(
        default="custom_reward_manager",
        metadata={"help": "The name the file's module gets in sys.modules, so other code can "
                          "import it by that name (null: a name of its own)."}
    )


@dataclass
class RewardManagerArguments:
    """Which reward manager scores the rows (verl's ``reward_manager`` section): one
    registered by name, or a class of your own loaded from a file."""

    source: str = field(
        default="register",
        metadata={"help": "'register': reward_manager.name is an installed manager ({names}, "
                          "or a siirl.reward_managers entry point); 'importlib': the class "
                          "reward_manager.name in reward_manager.module.path.",
                  "names": plugin_group("siirl.reward_managers")}
    )
    name: str = field(
        default="${reward_model.reward_manager}",
        metadata={"help": "The manager (source=register; verl's newer spelling of "
                          "reward_model.reward_manager) or its class name (source=importlib)."}
    )
    module: RewardManagerModuleArguments = field(
        default_factory=RewardManagerModuleArguments)


@dataclass
class CustomRewardFunctionArguments:
    """User reward function: Python file path, function name and extra kwargs."""

    path: str | None = field(
        default=None, metadata={"help": "Python file defining the reward function."}
    )
    name: str = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
