"""The ``megatron`` section of the megatron backend: its keys (verl's names and defaults),
where it mounts, the key rules of its keys and of the role's keys a megatron role cannot
honour (LoRA, Ulysses). Registered as ``siirl.config: megatron``;
core mounts it (``siirl.params.sections``) and says, for a role on another strategy, that
the section does not apply. Nothing heavy is imported here (megatron-core is not)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from siirl.params.key_conditions import cpu_run, get
from siirl.params.key_rule_kinds import Rule, notice, refused
from siirl.params.sections import ConfigSection, Mount, size, workers, workers_text
from siirl.params.value_rules import at_least, one_of
from siirl.plugins import install_hint

ACTOR, REF = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
# also the engine's own refusal (siirl.engine.megatron.offload), for workers elsewhere
OFFLOAD_ON_CPU = ("megatron offload moves a role's weights, gradients and optimizer state "
                  "to host memory between its steps, to free GPU memory for the rollout "
                  "and the other roles; this run computes on the CPU (trainer.device=cpu, "
                  "or auto where no GPU is visible), so there is nothing to free: leave it "
                  "false.")
_MIRRORED = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
             "virtual_pipeline_model_parallel_size", "sequence_parallel",
             "expert_model_parallel_size", "expert_tensor_parallel_size")
# refused for every role by the validation pass (megatron_size_problems) and the megatron
# engine: no rule may suggest it
NO_CONTEXT_PARALLEL = ("context parallelism is not supported by this release (it needs "
                       "Transformer Engine's attention)")
_ULYSSES = "ulysses_sequence_parallel_size"
# verl's override_transformer_config keys siiRL applies: the MoE router's losses
# (siirl.engine.megatron.router_loss); the others stay refused
ROUTER_OVERRIDE_KEYS = ("moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_load_balancing_type")
# TransformerConfig fields override_transformer_config may not set: the bridge derives them
# from the Hugging Face config (the HF weights fit no other shape) or the megatron section's
# own keys set them (the parallel layout, the dtype); every other field applies
DERIVED_TRANSFORMER_KEYS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "normalization", "layernorm_epsilon", "gated_linear_unit",
    "activation_func", "add_bias_linear", "add_qkv_bias", "qk_layernorm",
    "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_router_pre_softmax",
    "moe_router_score_function", "moe_shared_expert_intermediate_size",
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "virtual_pipeline_model_parallel_size", "sequence_parallel",
    "expert_model_parallel_size", "expert_tensor_parallel_size",
    "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
    "params_dtype", "bf16", "fp16", "pipeline_dtype", "use_cpu_initialization")
_LORA_RANK = "actor_rollout_ref.model.lora_rank"


@dataclass
class MegatronArguments:
    """Megatron-LM parallelism and offload settings (strategy=megatron)."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = True
    # bfloat16 (verl's default) / float16: 16-bit weights and compute, fp32 main weights in
    # megatron's mixed-precision optimizer (float16 with dynamic loss scaling); float32 here
    # by default so runs keep their numbers
    dtype: str = "float32"
    use_dist_checkpointing: bool = False
    dist_checkpointing_path: str | None = None
    seed: int = 42
    param_offload: bool = False
    grad_offload: bool = False
    optimizer_offload: bool = False
    override_transformer_config: dict[str, Any] = field(default_factory=dict)
    use_mbridge: bool = False


def _derived_overrides(config: Any, key: str) -> bool:
    return bool(set(get(config, key) or {}) & set(DERIVED_TRANSFORMER_KEYS))


def _differs_from_actor(config: Any, key: str) -> bool:
    return get(config, key) != get(config, f"{ACTOR}.megatron.{key.rsplit('.', 1)[1]}")


def _own_role_on_megatron(config: Any, key: str) -> bool:
    """The role of ``key`` (its ``strategy`` sibling) runs on megatron too."""
    return str(get(config, f"{key.rsplit('.', 1)[0]}.strategy")) == "megatron"


def _lora_without_megatron_actor(config: Any, key: str) -> bool:
    """LoRA with a megatron reference of a non-megatron actor (the reference is the actor's
    stage with adapters off). A megatron LoRA actor runs at any TP / SP / PP layout;
    siirl.engine.megatron.lora refuses experts and Transformer Engine's fused layers when
    the model is built."""
    return int(get(config, key) or 0) > 0 and str(get(config, f"{ACTOR}.strategy")) != "megatron"


def _lora_reference_rule() -> Rule:
    return refused(_LORA_RANK, "a megatron reference needs the megatron LoRA actor",
                   "with LoRA the reference is the actor's own model with its adapters "
                   f"off: set {REF}.strategy to the actor's strategy.",
                   _lora_without_megatron_actor)


def _role_keys(mount: Mount) -> List[Rule]:
    """The role's own keys a megatron role cannot honour."""
    if mount.role == "critic":
        return [
            refused(f"critic.{_ULYSSES}", "Ulysses runs on the fsdp strategy",
                    "Ulysses sequence parallelism splits sequences of the fsdp engines; a "
                    "megatron critic runs in the actor's megatron parallel state, whose "
                    "sequences actor_rollout_ref.actor.megatron.tensor_model_parallel_size "
                    "with sequence_parallel=true splits."),
        ]
    rules = [] if mount.role == "actor" else [_lora_reference_rule()]
    # one rule for both roles' keys where both run on megatron (one line for both)
    ulysses = (f"{ACTOR}.{_ULYSSES}", f"{REF}.{_ULYSSES}") if mount.role == "actor" \
        else (f"{REF}.{_ULYSSES}",)
    rules.append(refused(ulysses, "Ulysses runs on the fsdp strategy",
                         "Ulysses sequence parallelism splits sequences of the fsdp engines; "
                         "megatron splits them with actor_rollout_ref.actor.megatron."
                         "tensor_model_parallel_size and sequence_parallel=true "
                         f"({NO_CONTEXT_PARALLEL}).", _own_role_on_megatron))
    return rules


def megatron_rules(mount: Mount) -> List[Rule]:
    """The rules of one role's ``megatron`` section (and of its keys megatron cannot
    honour) where the role runs on megatron."""
    if mount.selector is None:  # the reward model's rules are the reward model's
        return []
    prefix, role = mount.path, mount.role
    rules = []
    if role != "actor":
        rules += [
            refused(tuple(f"{prefix}.{k}" for k in _MIRRORED), "set it under actor.megatron",
                    f"the {role} runs in the actor's megatron parallel state: set the same "
                    f"key under {ACTOR}.megatron instead.", _differs_from_actor),
            refused(f"{prefix}.context_parallel_size", "context parallelism is not supported",
                    f"{NO_CONTEXT_PARALLEL}; the {role} runs in the actor's megatron "
                    "parallel state: leave it at 1 and split the model with "
                    f"{ACTOR}.megatron.tensor_model_parallel_size (with sequence_parallel="
                    "true) and pipeline_model_parallel_size.",
                    lambda config, key: get(config, key) != 1),
            notice(f"{prefix}.use_distributed_optimizer", "no effect for this role",
                   f"the {role} does not use megatron's distributed optimizer."),
        ]
    optimizer_offload = (f"{prefix}.grad_offload", f"{prefix}.optimizer_offload")
    return _role_keys(mount) + rules + [
        refused((f"{prefix}.param_offload",) + (optimizer_offload if role != "reference"
                                                else ()), "no offload on a CPU run",
                OFFLOAD_ON_CPU, cpu_run),
        notice(optimizer_offload, "no effect: no optimizer", "the reference has no optimizer."),
        refused(f"{prefix}.use_dist_checkpointing", "needs dist_checkpointing_path",
                f"without {prefix}.dist_checkpointing_path there is no checkpoint to start "
                "from: set it to a megatron distributed checkpoint folder (written once by "
                "tools/megatron_dist_checkpoint.py, or a siiRL megatron checkpoint's "
                f"global_step_N/{'critic' if role == 'critic' else 'actor'}).",
                lambda config, key: bool(get(config, key)) and not get(
                    config, f"{prefix}.dist_checkpointing_path")),
        notice(f"{prefix}.dist_checkpointing_path", "no effect without use_dist_checkpointing",
               "the weights are converted from the Hugging Face model path unless "
               f"{prefix}.use_dist_checkpointing=true.",
               lambda config, key: not get(config, f"{prefix}.use_dist_checkpointing")),
        refused(f"{prefix}.override_transformer_config",
                "not the keys that shape the weights or the layout",
                "the model's shape comes from the Hugging Face config (change it through the "
                "role's model.override_config) and the parallel layout and dtype from the "
                f"megatron section's own keys; override_transformer_config may set any other "
                f"TransformerConfig field (not {', '.join(DERIVED_TRANSFORMER_KEYS[:6])}, ...; "
                "siirl.engine.megatron.config.DERIVED_TRANSFORMER_KEYS lists them).",
                _derived_overrides),
        notice(f"{prefix}.seed", "no effect: seeded from trainer.seed",
               "megatron's RNG is seeded from trainer.seed."),
        notice(f"{prefix}.use_mbridge", "no effect: siiRL's own bridge converts weights",
               "siiRL's own bridge converts Hugging Face weights (Llama, Qwen2, Qwen3, "
               "Qwen2-MoE, Qwen3-MoE, Mixtral)."),
    ]


_GROUP_SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                "context_parallel_size")


def model_parallel(config: Any) -> Optional[int]:
    """Workers that share rows in a megatron model: the actor's TP x PP x CP (the reference
    and the critic run in the actor's parallel state)."""
    sizes = [size(config, f"{ACTOR}.megatron.{k}") for k in _GROUP_SIZES]
    if None in sizes:
        return None
    return sizes[0] * sizes[1] * sizes[2]


def megatron_size_problems(cp: Optional[int], pp: Optional[int], vpp: Optional[int]
                           ) -> List[str]:
    """The parallel sizes the engine refuses whatever the model: context parallelism, and
    virtual stages without pipeline stages (the engine asks again,
    siirl.engine.megatron.setup)."""
    problems = []
    if cp and cp != 1:
        problems.append(f"{ACTOR}.megatron.context_parallel_size={cp}: context parallelism is "
                        "not supported by this release (it needs Transformer Engine's "
                        "attention); use tensor and pipeline parallelism")
    if vpp and vpp > 1 and pp == 1:
        problems.append(f"{ACTOR}.megatron.virtual_pipeline_model_parallel_size={vpp} needs "
                        "pipeline_model_parallel_size > 1")
    return problems


def megatron_constraints(config: Any) -> List[str]:
    """The actor's megatron sizes, where the actor or the critic runs on megatron (a
    megatron reference or critic runs in the actor's parallel state)."""
    if all(str(get(config, f"{role}.strategy")) != "megatron" for role in (ACTOR, "critic")):
        return []
    problems, count, group = [], workers(config), model_parallel(config)
    if count and group and count % group:
        sizes = " x ".join(f"{ACTOR}.megatron.{k}={get(config, f'{ACTOR}.megatron.{k}')}"
                           for k in _GROUP_SIZES)
        problems.append(f"{sizes} = {group} (the workers of one megatron model) must divide "
                        f"{workers_text(count)}")
    experts = size(config, f"{ACTOR}.megatron.expert_model_parallel_size")
    expert_tp = size(config, f"{ACTOR}.megatron.expert_tensor_parallel_size")
    if expert_tp and expert_tp != size(config, f"{ACTOR}.megatron.tensor_model_parallel_size"):
        stages = size(config, f"{ACTOR}.megatron.pipeline_model_parallel_size") or 1
        if count and experts and count % (expert_tp * experts * stages):
            problems.append(
                f"{ACTOR}.megatron.expert_tensor_parallel_size={expert_tp} x "
                f"expert_model_parallel_size={experts} x pipeline_model_parallel_size="
                f"{stages} must divide {workers_text(count)}: the experts' own layout is "
                "expert TP x EP x expert data parallel x PP")
    elif count and group and experts and not count % group and (count // group) % experts:
        problems.append(f"{ACTOR}.megatron.expert_model_parallel_size={experts} must divide "
                        f"the data-parallel size {count // group} ({workers_text(count)} / "
                        f"{group} workers per megatron model): the experts are split over "
                        "data-parallel ranks")
    return problems + megatron_size_problems(
        *(size(config, f"{ACTOR}.megatron.{k}") for k in (
            "context_parallel_size", "pipeline_model_parallel_size",
            "virtual_pipeline_model_parallel_size")))


SECTION = ConfigSection(
    schema=MegatronArguments,
    mounts=(
        Mount(f"{ACTOR}.megatron", "actor", f"{ACTOR}.strategy"),
        Mount(f"{REF}.megatron", "reference", f"{REF}.strategy", after="strategy"),
        Mount("critic.megatron", "critic", "critic.strategy"),
        # the reward model's rules are its section's (siirl.engine.reward_model.config)
        Mount("reward_model.megatron", "reward_model", after="overlong_buffer"),
    ),
    applies_to=("megatron",),
    label="megatron",
    rules=megatron_rules,
    constraints=megatron_constraints,
    model_parallel=model_parallel,
    model_parallel_keys=f"{ACTOR}.megatron.tensor_model_parallel_size (x pipeline x context)",
    # tensor_model_parallel_size: core's rule on every *tensor_model_parallel_size
    value_rules=(one_of(("float32", "bfloat16", "float16"), ("*.megatron.dtype",)),
                 at_least(1, ("*.megatron.pipeline_model_parallel_size",
                              "*.megatron.context_parallel_size",
                              "*.megatron.expert_model_parallel_size")),
                 at_least(1, ("*.megatron.virtual_pipeline_model_parallel_size",
                              "*.megatron.expert_tensor_parallel_size"), " (or null)")),
    requires=("megatron.core", "megatron-core", install_hint("siirl.engines", "megatron")),
)
