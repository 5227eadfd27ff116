"""The reward model's sections (engine role ``reward_model``, ``reward_model.enable=true``):
``reward_model.model`` (the sequence classifier or judge model, its tokenizer and sharding)
and ``reward_model.judge`` (the LLM judge of ``style=generative``), with the rules of the
reward model's keys. Registered as ``siirl.config: reward_model`` and ``reward_judge``;
nothing heavy is imported here: ``siirl-train --help`` reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from siirl.engine.fsdp.config import FSDPArguments
from siirl.engine.megatron.config import (
    DERIVED_TRANSFORMER_KEYS,
    NO_CONTEXT_PARALLEL,
    OFFLOAD_ON_CPU,
)
from siirl.params.key_conditions import cpu_run, get
from siirl.params.key_rule_kinds import Rule, notice, refused
from siirl.params.sections import ConfigSection, Mount
from siirl.params.value_rules import above, at_least, one_of


@dataclass
class RewardModelModelArguments:
    """Model-based reward: RM path, input tokenizer and sharding."""

    input_tokenizer: str | None = "${actor_rollout_ref.model.path}"
    path: str = "~/models/FsfairX-LLaMA3-RM-v0.1"
    external_lib: str | None = "${actor_rollout_ref.model.external_lib}"
    use_remove_padding: bool = False
    use_fused_kernels: bool = "${actor_rollout_ref.model.use_fused_kernels}"
    trust_remote_code: bool = False
    override_config: dict[str, Any] = field(default_factory=dict)  # verl's key
    use_shm: bool = False  # verl's key
    fsdp_config: FSDPArguments = field(default_factory=FSDPArguments)


@dataclass
class GenerativeJudgeArguments:
    """The LLM judge of reward_model.style=generative (siiRL's keys)."""

    source: str = field(
        default="rollout", metadata={"help": "Who judges: 'rollout' (the actor's rollout "
                                             "engine: the policy grades itself) or 'model' "
                                             "(a causal LM at reward_model.model.path)."}
    )
    template: str | None = field(
        default=None, metadata={"help": "Judge prompt with {question} and {response}; the "
                                        "grade is read after 'Score:' (default: a 0-10 "
                                        "rating prompt ending in 'Score:')."}
    )
    max_new_tokens: int = field(
        default=16, metadata={"help": "Tokens the judge may reply with."}
    )
    max_score: float = field(
        default=10.0, metadata={"help": "The top grade: grades are clipped to [0, max_score] "
                                        "and divided by it."}
    )


_REWARD_MODEL_KEYS = tuple(f"reward_model.{k}" for k in (
    "strategy", "model.*", "micro_batch_size", "micro_batch_size_per_gpu", "max_length",
    "ulysses_sequence_parallel_size", "use_dynamic_bsz", "forward_max_token_len_per_gpu",
    "style", "rm_weight", "judge.*", "enable_resource_pool", "n_gpus_per_node", "nnodes",
    "rollout.*", "megatron.*"))
_RM_CLASSIFIER_KEYS = tuple(f"reward_model.{k}" for k in (
    "micro_batch_size", "micro_batch_size_per_gpu", "use_dynamic_bsz",
    "forward_max_token_len_per_gpu", "ulysses_sequence_parallel_size", "model.fsdp_config.*",
    "model.use_remove_padding"))


def _rm_off(config: Any, key: str) -> bool:
    return not get(config, "reward_model.enable", False)


def _rm_judge(config: Any, key: str) -> bool:
    return str(get(config, "reward_model.style", "discriminative")) == "generative"


def _rm_classifier(config: Any, key: str) -> bool:
    return not _rm_off(config, key) and not _rm_judge(config, key)


def _on_megatron(config: Any, key: str) -> bool:
    return str(get(config, "reward_model.strategy", "fsdp")) == "megatron"


def _megatron_classifier(config: Any, key: str) -> bool:
    return _rm_classifier(config, key) and _on_megatron(config, key)


_MEGATRON = "reward_model.megatron"
# the reward model runs in the actor's megatron parallel state: its own values may only
# repeat the actor's
_MIRRORED = tuple(f"{_MEGATRON}.{k}" for k in (
    "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "sequence_parallel", "expert_model_parallel_size",
    "expert_tensor_parallel_size"))


def _differs_from_actor(config: Any, key: str) -> bool:
    return _megatron_classifier(config, key) and get(config, key) != get(
        config, f"actor_rollout_ref.actor.megatron.{key.rsplit('.', 1)[1]}")


def megatron_rules() -> List[Rule]:
    """The rules of ``reward_model.megatron`` (``reward_model.strategy=megatron``: the
    sequence classifier as a megatron GPTModel, ``siirl.engine.megatron.reward_model``)."""
    return [
        refused("reward_model.strategy", "the generative judge does not run on megatron",
                "with reward_model.style=generative the judge replies through a rollout "
                "engine (the actor's, or an HF one of reward_model.model.path), not a "
                "megatron model: set reward_model.strategy=fsdp (only the sequence classifier, "
                "style=discriminative, runs on megatron).",
                lambda config, key: _on_megatron(config, key) and _rm_judge(config, key)),
        notice(f"{_MEGATRON}.*", "no effect: reward_model.strategy is not megatron",
               "reward_model.megatron.* only act with reward_model.strategy=megatron (the "
               "sequence classifier as a megatron GPTModel).",
               lambda config, key: not _on_megatron(config, key)),
        refused(_MIRRORED, "set it under actor.megatron",
                "the reward model runs in the actor's megatron parallel state: set the same "
                "key under actor_rollout_ref.actor.megatron instead.", _differs_from_actor),
        refused(f"{_MEGATRON}.context_parallel_size", "context parallelism is not supported",
                f"{NO_CONTEXT_PARALLEL}; the reward model runs in the actor's megatron "
                "parallel state: leave it at 1.",
                lambda config, key: _megatron_classifier(config, key) and get(config, key) != 1),
        refused(f"{_MEGATRON}.param_offload", "no offload on a CPU run", OFFLOAD_ON_CPU,
                lambda config, key: _megatron_classifier(config, key) and cpu_run(config, key)),
        notice((f"{_MEGATRON}.grad_offload", f"{_MEGATRON}.optimizer_offload",
                f"{_MEGATRON}.use_distributed_optimizer"), "no effect: no optimizer",
               "the reward model is frozen: it has no gradients and no optimizer.",
               _megatron_classifier),
        refused(f"{_MEGATRON}.use_dist_checkpointing", "built from the HF classifier",
                "the megatron reward model is converted from the Hugging Face sequence "
                "classifier at reward_model.model.path (a megatron distributed checkpoint holds "
                "no score head): leave it false.", _megatron_classifier),
        notice(f"{_MEGATRON}.dist_checkpointing_path", "no effect: built from the HF classifier",
               "the reward model's weights come from reward_model.model.path.",
               _megatron_classifier),
        refused(f"{_MEGATRON}.override_transformer_config",
                "not the keys that shape the weights or the layout",
                "the model's shape comes from the Hugging Face config (change it through "
                "reward_model.model.override_config) and the parallel layout from the actor's "
                "megatron section; override_transformer_config may set any other "
                "TransformerConfig field (siirl.engine.megatron.config."
                "DERIVED_TRANSFORMER_KEYS lists those it may not).",
                lambda config, key: _megatron_classifier(config, key) and bool(
                    set(get(config, key) or {}) & set(DERIVED_TRANSFORMER_KEYS))),
        notice(f"{_MEGATRON}.seed", "no effect: seeded from trainer.seed",
               "megatron's RNG is seeded from trainer.seed.", _megatron_classifier),
        notice(f"{_MEGATRON}.use_mbridge", "no effect: siiRL's own bridge converts weights",
               "siiRL's own bridge converts the classifier's decoder (Llama, Qwen2, Qwen3, "
               "Qwen2-MoE, Qwen3-MoE, Mixtral).", _megatron_classifier),
        notice("reward_model.model.fsdp_config.*", "no effect: the reward model runs on megatron",
               "with reward_model.strategy=megatron the reward model is split by the actor's "
               "megatron parallel state, not FSDP.", _megatron_classifier),
    ]


def reward_model_rules(mount: Mount) -> List[Rule]:
    """The rules of the reward model's keys, in the order the first that holds decides."""
    return [
        notice("reward_model.model.use_shm", "no effect: files are read in place",
               "copying files to shared memory is not implemented; they are read where they "
               "are."),
        notice(_REWARD_MODEL_KEYS, "no effect without a reward model",
               "reward-model settings only act with reward_model.enable=true.", _rm_off),
        refused("reward_model.enable", "not with the embodied reward manager",
                "the embodied reward manager scores episodes, not text a reward model could "
                "read: keep reward_model.enable=false with reward_model.reward_manager=embodied.",
                lambda config, key: get(config, "reward_model.reward_manager") == "embodied"),
        *megatron_rules(),
        notice("reward_model.judge.*", "no effect unless style=generative",
               "judge settings only act with reward_model.style=generative.",
               lambda config, key: not _rm_judge(config, key)),
        notice(_RM_CLASSIFIER_KEYS, "no effect with the generative judge",
               "the judge replies through a rollout engine (its batches: "
               "actor_rollout_ref.rollout.max_num_seqs); sequence-classifier settings do not "
               "apply.", _rm_judge),
        notice(("reward_model.model.path", "reward_model.model.trust_remote_code",
                "reward_model.model.external_lib"), "no effect: the judge is the rollout engine",
               "with reward_model.judge.source=rollout the policy's rollout engine judges; "
               "reward_model.model.* names a judge of its own with judge.source=model.",
               lambda config, key: _rm_judge(config, key) and
               str(get(config, "reward_model.judge.source", "rollout")) == "rollout"),
        refused(("reward_model.model.fsdp_config.param_offload",
                 "reward_model.model.fsdp_config.offload_policy"),
                "not for the reward model",
                "CPU offload is implemented for the actor, reference and critic (fsdp_config."
                "param_offload); the reward model stays on the GPU: leave it false.",
                _rm_classifier),
        notice("reward_model.model.fsdp_config.optimizer_offload", "no effect: no optimizer",
               "the reward model is frozen: it has no optimizer.", _rm_classifier),
        notice(("reward_model.model.fsdp_config.wrap_policy",
                "reward_model.model.fsdp_config.forward_prefetch"),
               "no effect: FSDP2 shards every decoder layer",
               "FSDP2 here shards each decoder layer and the root (or, with fsdp_size=1, "
               "replicates the whole model); wrapping and prefetch are not tunable.",
               _rm_classifier),
        notice("reward_model.model.use_remove_padding", "no effect: padded micro-batches",
               "the reward model scores padded micro-batches (the same scores); sequence "
               "packing is implemented for the actor and critic only.", _rm_classifier),
        notice("reward_model.model.use_fused_kernels", "no effect: transformers kernels",
               "fused GPU kernels are not used; the reward model runs with its transformers "
               "implementation."),
        refused("reward_model.ulysses_sequence_parallel_size", "not for the reward model",
                "the reward model scores whole rows on every worker; Ulysses sequence "
                "parallelism splits the actor's, reference's and critic's sequences only: keep "
                "it at 1.", _rm_classifier),
        notice("reward_model.micro_batch_size", "deprecated: set the *_per_gpu key",
               "verl's deprecated global micro-batch size is not read: set "
               "reward_model.micro_batch_size_per_gpu.", _rm_classifier),
        notice("reward_model.forward_max_token_len_per_gpu", "no effect without dynamic batch size",
               "the token budget only acts with reward_model.use_dynamic_bsz=true.",
               lambda config, key: _rm_classifier(config, key) and
               not get(config, "reward_model.use_dynamic_bsz")),
    ]


SECTION = ConfigSection(
    schema=RewardModelModelArguments,
    mounts=(Mount("reward_model.model", "reward_model", after="strategy"),),
    rules=reward_model_rules,
)
JUDGE_SECTION = ConfigSection(
    schema=GenerativeJudgeArguments,
    mounts=(Mount("reward_model.judge", "reward_model", after="rm_weight"),),
    value_rules=(at_least(1, "reward_model.judge.max_new_tokens"),
                 above(0, "reward_model.judge.max_score"),
                 one_of(("rollout", "model"), "reward_model.judge.source")),
)
