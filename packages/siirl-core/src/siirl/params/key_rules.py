"""The table of configuration keys this release does not read: each rule names keys (dotted,
or fnmatch globs), their class (not applying / refused), a short tag for ``--help`` and why,
with what works instead. ``siirl.params.key_support`` applies it; keys no rule matches are
read. A rule may hold only under a condition (``when``, from ``key_conditions``); where
none holds the key is read.
When an issue implements a key, it deletes the key's rule here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Tuple

from siirl.params.key_conditions import (
    ACTOR,
    REF,
    ROLLOUT,
    Condition,
    budget_unused,
    builtin_workflow_is_not,
    cpu_run,
    critic_disagrees,
    custom_workflow,
    differs_from_actor,
    engine_rollout,
    get,
    hf_rollout,
    no_dynamic_sampling,
    no_dynamic_sampling_possible,
    remove_padding_off,
    strategy_is,
)

NOT_APPLYING, REFUSED = "not applying", "refused"


def always(config: Any, key: str) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Rule:
    patterns: Tuple[str, ...]  # dotted keys or fnmatch globs ("a.b.*")
    kind: str  # NOT_APPLYING or REFUSED
    tag: str  # short label for --help
    why: str  # why it is ignored and what works instead
    when: Condition = always  # the rule holds only where this is true


def _na(patterns, tag: str, why: str, when: Optional[Condition] = None) -> Rule:
    patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    return Rule(patterns, NOT_APPLYING, tag, why, *([when] if when else []))


def _refused(patterns, tag: str, why: str, when: Optional[Condition] = None) -> Rule:
    patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    return Rule(patterns, REFUSED, tag, why, *([when] if when else []))


# ---- the table ---------------------------------------------------------------------------

# also the fsdp engine's own refusal, for engines built without the validation pass
OFFLOAD_ON_CPU = ("CPU offload (FSDP2's CPUOffloadPolicy) moves parameters, gradients and "
                  "optimizer state from the GPU to host memory; this run computes on the "
                  "CPU (trainer.device=cpu, or auto where no GPU is visible), so there is "
                  "nothing to offload: leave it false.")
_MEGATRON_OFFLOAD = ("megatron CPU offload is not implemented; parameters and optimizer "
                     "state stay on the GPU (on a GPU run strategy=fsdp offloads with "
                     "fsdp_config.param_offload; a CPU run has nothing to offload).")
_ULYSSES = "ulysses_sequence_parallel_size"
_NO_MEGATRON_PACKING = (
    "remove-padding (sequence packing) runs on the fsdp strategy only: the megatron models "
    "take padded micro-batches (megatron's own THD packing is not wired up); with "
    "strategy=megatron set use_remove_padding=false, or use strategy=fsdp.")
_MIRRORED = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
             "virtual_pipeline_model_parallel_size", "sequence_parallel")
# refused for every role by the validation pass (constraints.megatron_size_problems) and the
# megatron engine: no rule may suggest it
_NO_CONTEXT_PARALLEL = ("context parallelism is not supported by this release (it needs "
                        "Transformer Engine's attention)")


def _fsdp_rules(prefix: str, strategy_key: str, has_optimizer: bool) -> List[Rule]:
    offload = (f"{prefix}.param_offload", f"{prefix}.offload_policy")
    return [
        _na(f"{prefix}.*", "no effect with strategy=megatron",
            f"FSDP settings do not apply when {strategy_key}=megatron.",
            strategy_is(strategy_key, megatron=True)),
        _refused(offload + ((f"{prefix}.optimizer_offload",) if has_optimizer else ()),
                 "no offload on a CPU run", OFFLOAD_ON_CPU, cpu_run),
        *([] if has_optimizer else [_na(f"{prefix}.optimizer_offload", "no effect: no optimizer",
                                       "the reference policy has no optimizer.")]),
        _na((f"{prefix}.wrap_policy", f"{prefix}.forward_prefetch"),
            "no effect: FSDP2 shards every decoder layer",
            "FSDP2 here shards each decoder layer and the root (or, with fsdp_size=1, "
            "replicates the whole model); wrapping and prefetch are not tunable."),
    ]


def _megatron_rules(prefix: str, strategy_key: str, role: str) -> List[Rule]:
    rules = [_na(f"{prefix}.*", "no effect unless strategy=megatron",
                 f"megatron settings apply only when {strategy_key}=megatron.",
                 strategy_is(strategy_key, megatron=False))]
    if role != "actor":
        rules += [
            _refused(tuple(f"{prefix}.{k}" for k in _MIRRORED), "set it under actor.megatron",
                     f"the {role} runs in the actor's megatron parallel state: set the same "
                     f"key under {ACTOR}.megatron instead.", differs_from_actor),
            _refused(f"{prefix}.context_parallel_size", "context parallelism is not supported",
                     f"{_NO_CONTEXT_PARALLEL}; the {role} runs in the actor's megatron "
                     "parallel state: leave it at 1 and split the model with "
                     f"{ACTOR}.megatron.tensor_model_parallel_size (with sequence_parallel="
                     "true) and pipeline_model_parallel_size.",
                     lambda config, key: get(config, key) != 1),
            _na(f"{prefix}.use_distributed_optimizer", "no effect for this role",
                f"the {role} does not use megatron's distributed optimizer."),
        ]
    optimizer_offload = (f"{prefix}.grad_offload", f"{prefix}.optimizer_offload")
    return rules + [
        _refused((f"{prefix}.param_offload",) + (optimizer_offload if role != "reference"
                                                 else ()), "megatron offload is not implemented",
                 _MEGATRON_OFFLOAD),
        _na(optimizer_offload, "no effect: no optimizer", "the reference has no optimizer."),
        _refused((f"{prefix}.expert_model_parallel_size", f"{prefix}.expert_tensor_parallel_size"),
                 "expert parallelism is not supported",
                 "expert parallelism is not supported: the megatron bridge builds dense "
                 "Llama/Qwen2 models."),
        _refused(f"{prefix}.use_dist_checkpointing", "models are built from HF weights",
                 "the megatron model is always built from the Hugging Face weights of the "
                 "model path; starting from a megatron dist checkpoint is not supported."),
        _na(f"{prefix}.dist_checkpointing_path", "no effect without use_dist_checkpointing",
            "it only acts with use_dist_checkpointing=true, which this release refuses."),
        _refused(f"{prefix}.override_transformer_config", "overrides are not applied",
                 "the TransformerConfig is derived from the Hugging Face config; change that "
                 "through actor_rollout_ref.model.override_config instead."),
        _na(f"{prefix}.seed", "no effect: seeded from trainer.seed",
            "megatron's RNG is seeded from trainer.seed."),
        _na(f"{prefix}.use_mbridge", "no effect: siiRL's own bridge converts weights",
            "siiRL's own bridge converts Hugging Face weights (Llama, Qwen2)."),
    ]


_VLLM_KNOBS = tuple(f"{ROLLOUT}.{k}" for k in (
    "mode", "chat_scheduler", "gpu_memory_utilization", "enforce_eager", "free_cache_engine",
    "load_format", "layered_summon", "max_num_batched_tokens", "max_model_len",
    "disable_log_stats", "enable_chunked_prefill", "multi_stage_wake_up",
    "update_weights_bucket_megabytes", "engine_kwargs", "server_timeout_s",
    "seed_per_prompt"))
_REWARD_MODEL_KEYS = tuple(f"reward_model.{k}" for k in (
    "strategy", "model.*", "micro_batch_size", "micro_batch_size_per_gpu", "max_length",
    "ulysses_sequence_parallel_size", "use_dynamic_bsz", "forward_max_token_len_per_gpu",
    "style", "rm_weight", "judge.*", "enable_resource_pool", "n_gpus_per_node", "nnodes",
    "rollout.*"))
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

RULES: Tuple[Rule, ...] = (
    # -- algorithm
    _refused("algorithm.use_pf_ppo", "pf-PPO is not implemented",
             "pf-PPO sample reweighting is not implemented; samples keep equal weights."),
    _na("algorithm.pf_ppo.*", "no effect without use_pf_ppo",
        "it only acts with algorithm.use_pf_ppo=true, which this release refuses."),
    _refused("algorithm.filter_groups.enable", "dynamic sampling needs group advantages",
             "dynamic sampling (filter_groups) runs in the DAPO workflow, with group "
             "advantages: it drops groups whose rewards do not vary, which a critic's "
             "advantages (gae) and the AGENTIC/EMBODIED workflows do not use. Use a group "
             "estimator (grpo, ...) under the DEFAULT or DAPO workflow.",
             no_dynamic_sampling_possible),
    _na("algorithm.filter_groups.*", "no effect without dynamic sampling",
        "filter_groups is read by the DAPO workflow (algorithm.workflow_type=DAPO, or "
        "algorithm.filter_groups.enable=true with group advantages).", no_dynamic_sampling),
    _na("algorithm.embodied_sampling.*", "no effect outside the EMBODIED workflow",
        "embodied_sampling is read by the EMBODIED workflow (algorithm.workflow_type=EMBODIED).",
        builtin_workflow_is_not("EMBODIED")),
    # -- data
    _refused("data.tokenizer", "prompts use the model's tokenizer",
             "prompts are tokenized with the policy's tokenizer (actor_rollout_ref.model.path); "
             "leave data.tokenizer null."),
    _refused("data.custom_cls.*", "custom dataset classes are not supported",
             "custom dataset classes are not supported: write verl-format parquet or JSON "
             "lines (prompt, data_source, reward_model.ground_truth, ...)."),
    _refused("data.sampler.*", "custom samplers are not supported",
             "custom samplers (curricula) are not supported; the training order is a seeded "
             "shuffle (data.shuffle, data.seed)."),
    _na(("data.use_shm", "actor_rollout_ref.model.use_shm", "reward_model.model.use_shm"),
        "no effect: files are read in place",
        "copying files to shared memory is not implemented; they are read where they are."),
    _refused("data.gen_batch_size", "read by dynamic sampling only",
             "data.gen_batch_size prompts make one generation round of DAPO's dynamic "
             "sampling (algorithm.filter_groups.enable=true); without it every step "
             "generates data.train_batch_size prompts: set that instead.",
             lambda config, key: no_dynamic_sampling(config, key) and
             get(config, key) != get(config, "data.train_batch_size")),
    _na("data.return_raw_chat", "no effect: the raw chat is always kept",
        "every row keeps its chat messages (raw_prompt) whatever this says; multi-turn and "
        "agentic rollouts read them from there."),
    _na("data.return_raw_input_ids", "no effect: the reward model makes its own inputs",
        "the reward model reads the actor's ids, or (another tokenizer) decodes and "
        "re-tokenises the prompt and response itself: no raw ids are needed."),
    _na("data.return_full_prompt", "no effect: rows keep their chat messages",
        "every row keeps its chat messages (raw_prompt); multi-turn and agentic rollouts "
        "apply the chat template to them themselves."),
    _na("data.validation_shuffle", "no effect: validation covers the whole set",
        "validation scores the whole set, so its order does not change the metrics."),
    _na(("data.dataloader_num_workers", "data.filter_overlong_prompts_workers"),
        "no effect: data is read in the worker process",
        "datasets are read and filtered in the worker process itself."),
    _na(("data.image_key", "data.video_key", "data.return_multi_modal_inputs"),
        "no effect: prompts are text only",
        "multi-modal inputs are not supported; prompts are text only."),
    _na("data.trust_remote_code", "no effect: the tokenizer is the model's",
        "the tokenizer comes with the model and follows "
        "actor_rollout_ref.model.trust_remote_code."),
    # -- policy model
    _refused("actor_rollout_ref.hybrid_engine", "the rollout shares the actor's weights",
             "the rollout always samples with the actor's own weights (hybrid engine); a "
             "separate rollout copy is not implemented."),
    _refused("actor_rollout_ref.model.lora_rank", "LoRA runs on the fsdp strategy",
             "LoRA adapters are built for the fsdp actor and reference only; with "
             "actor_rollout_ref.actor.strategy=megatron (or ref.strategy=megatron) train all "
             "weights (lora_rank=0) or use strategy=fsdp.",
             lambda config, key: any(str(get(config, f"{role}.strategy")) == "megatron"
                                     for role in (ACTOR, REF))),
    _na(("actor_rollout_ref.model.lora_alpha", "actor_rollout_ref.model.target_modules",
         "actor_rollout_ref.model.exclude_modules",
         "actor_rollout_ref.model.lora_merge_on_export"), "no effect without LoRA",
        "LoRA settings only act with actor_rollout_ref.model.lora_rank > 0.",
        lambda config, key: not (get(config, "actor_rollout_ref.model.lora_rank") or 0) > 0),
    _refused("critic.model.lora_rank", "LoRA is built for the actor only",
             "the critic trains all its weights; LoRA adapters are built for the actor "
             "(actor_rollout_ref.model.lora_rank) only: keep critic.model.lora_rank=0."),
    _na(("critic.model.lora_alpha", "critic.model.target_modules"),
        "no effect: the critic has no LoRA",
        "the critic trains all its weights (critic.model.lora_rank is refused)."),
    _refused("actor_rollout_ref.model.use_remove_padding", "packing runs on the fsdp strategy",
             _NO_MEGATRON_PACKING, lambda config, key: any(
                 str(get(config, f"{role}.strategy")) == "megatron" for role in (ACTOR, REF))),
    _refused("critic.model.use_remove_padding", "packing runs on the fsdp strategy",
             _NO_MEGATRON_PACKING, strategy_is("critic.strategy", megatron=True)),
    _refused(("actor_rollout_ref.model.enable_activation_offload",
              "critic.model.enable_activation_offload"), "activation offload is not implemented",
             "activation offload is not implemented; enable_gradient_checkpointing "
             "(on by default for GPUs) saves activation memory."),
    _na(("actor_rollout_ref.model.use_liger", "actor_rollout_ref.model.use_fused_kernels",
         "actor_rollout_ref.model.fused_kernel_options"), "no effect: transformers kernels",
        "fused GPU kernels (Liger, verl's fused log-prob kernels) are not used; the model runs "
        "with its transformers implementation."),
    # -- actor / reference / critic batching
    _na((f"{ACTOR}.ppo_micro_batch_size", f"{REF}.log_prob_micro_batch_size",
         f"{ROLLOUT}.log_prob_micro_batch_size", "critic.ppo_micro_batch_size",
         "critic.forward_micro_batch_size"), "deprecated: set the *_per_gpu key",
        "verl's deprecated global micro-batch sizes are not read: set the matching *_per_gpu "
        "key."),
    _refused((f"{ACTOR}.use_dynamic_bsz", f"{REF}.log_prob_use_dynamic_bsz",
              f"{ROLLOUT}.log_prob_use_dynamic_bsz"), "not with the megatron strategy yet",
             "dynamic (token-budget) batch sizes run on the fsdp strategy; Megatron's "
             "pipeline schedule needs micro-batches of equal rows.",
             strategy_is(f"{ACTOR}.strategy", True)),
    _refused("critic.use_dynamic_bsz", "not with the megatron strategy yet",
             "dynamic (token-budget) batch sizes run on the fsdp strategy; Megatron's "
             "pipeline schedule needs micro-batches of equal rows.",
             strategy_is("critic.strategy", True)),
    _na((f"{ACTOR}.ppo_max_token_len_per_gpu", f"{REF}.log_prob_max_token_len_per_gpu",
         f"{ROLLOUT}.log_prob_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu",
         "critic.forward_max_token_len_per_gpu"), "no effect without dynamic batch size",
        "token budgets only act with the matching use_dynamic_bsz=true.", budget_unused),
    _refused((f"{ACTOR}.{_ULYSSES}", f"{REF}.{_ULYSSES}"), "Ulysses runs on the fsdp strategy",
             "Ulysses sequence parallelism splits sequences of the fsdp engines; megatron "
             "splits them with actor_rollout_ref.actor.megatron.tensor_model_parallel_size "
             f"and sequence_parallel=true ({_NO_CONTEXT_PARALLEL}).",
             lambda config, key: str(get(config, f"{key.rsplit('.', 1)[0]}.strategy"))
             == "megatron"),
    _refused("critic.ulysses_sequence_parallel_size", "Ulysses runs on the fsdp strategy",
             "Ulysses sequence parallelism splits sequences of the fsdp engines; a megatron "
             "critic runs in the actor's megatron parallel state, whose sequences "
             "actor_rollout_ref.actor.megatron.tensor_model_parallel_size with "
             "sequence_parallel=true splits.",
             strategy_is("critic.strategy", megatron=True)),
    _refused((f"{ACTOR}.{_ULYSSES}", f"{REF}.{_ULYSSES}"), "needs use_remove_padding=true",
             "Ulysses sequence parallelism splits packed rows: set "
             "actor_rollout_ref.model.use_remove_padding=true (verl requires it as well).",
             remove_padding_off("actor_rollout_ref.model")),
    _refused("critic.ulysses_sequence_parallel_size", "needs use_remove_padding=true",
             "Ulysses sequence parallelism splits packed rows: set "
             "critic.model.use_remove_padding=true (verl requires it as well).",
             remove_padding_off("critic.model")),
    _refused(f"{REF}.{_ULYSSES}", "the reference runs in the actor's groups",
             "the reference computes in the actor's sequence-parallel groups (its rows are "
             "laid out as the actor's, and it may share the actor's module): set "
             f"{ACTOR}.{_ULYSSES} only.",
             lambda config, key: get(config, key) != get(config, f"{ACTOR}.{_ULYSSES}")),
    _na((f"{ACTOR}.use_torch_compile", f"{REF}.use_torch_compile"),
        "no effect: log-probs run eagerly",
        "torch.compile is not applied; log-probs and entropy run eagerly (same values)."),
    _na((f"{ACTOR}.entropy_from_logits_with_chunking", f"{ACTOR}.entropy_checkpointing",
         f"{REF}.entropy_from_logits_with_chunking", f"{REF}.entropy_checkpointing"),
        "no effect: entropy in one pass",
        "verl's memory savers for the entropy are not used; it is computed in one pass "
        "(same values)."),
    *_fsdp_rules(f"{ACTOR}.fsdp_config", f"{ACTOR}.strategy", has_optimizer=True),
    *_fsdp_rules(f"{REF}.fsdp_config", f"{REF}.strategy", has_optimizer=False),
    *_fsdp_rules("critic.model.fsdp_config", "critic.strategy", has_optimizer=True),
    *_megatron_rules(f"{ACTOR}.megatron", f"{ACTOR}.strategy", "actor"),
    *_megatron_rules(f"{REF}.megatron", f"{REF}.strategy", "reference"),
    *_megatron_rules("critic.megatron", "critic.strategy", "critic"),
    # -- rollout
    _na(_VLLM_KNOBS, "no effect with the hf rollout",
        "vLLM/SGLang engine settings; the hf rollout samples with the actor's own module "
        "(rollout.name=vllm or sglang uses them).", hf_rollout),
    _na(tuple(f"{ROLLOUT}.{k}" for k in ("chat_scheduler", "layered_summon",
                                         "multi_stage_wake_up")),
        "no effect with the vllm and sglang rollouts",
        "the vllm and sglang rollouts run one engine per worker: no chat scheduler, and its "
        "weights are loaded in place in one pass.", engine_rollout),
    _na(f"{ROLLOUT}.dtype", "no effect with the hf rollout",
        "the hf rollout samples with the actor's module, in the actor's dtype.", hf_rollout),
    _na(f"{ROLLOUT}.prompt_length", "no effect with the hf rollout",
        "the hf rollout takes prompts as the dataloader made them (data.max_prompt_length).",
        hf_rollout),
    _na("actor_rollout_ref.actor.policy_drift_coeff", "no effect without the CPGD loss",
        "the policy-drift term belongs to CPGD's loss (algorithm.adv_estimator=cpgd, or "
        "actor_rollout_ref.actor.use_cpgd_loss=true), as in siiRL.",
        lambda config, key: not get(config, "actor_rollout_ref.actor.use_cpgd_loss")),
    _refused(f"{ROLLOUT}.model_update_frequency", "needs an engine rollout",
             "the hf rollout samples with the actor's own weights, which every update "
             "changes; a model update frequency needs rollout.name=vllm or sglang.",
             hf_rollout),
    _refused(f"{ROLLOUT}.response_length", "set data.max_response_length",
             "the rollouts generate data.max_response_length tokens: set that instead."),
    _refused("actor_rollout_ref.actor.tis_imp_ratio_cap", "needs an inference-engine rollout",
             "truncated importance sampling weighs the trainer's log-probs against those of "
             "the engine that sampled; the hf rollout samples with the trainer's own module. "
             "Use it with rollout.name=vllm or sglang.", hf_rollout),
    _refused("actor_rollout_ref.actor.tis_imp_ratio_cap", "needs policy_loss.loss_mode=vanilla",
             "truncated importance sampling is applied by the vanilla PPO loss only (as in "
             "verl).", lambda config, key: str(get(
                 config, "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"))
             != "vanilla"),
    _refused(f"{ROLLOUT}.use_fire_sampling", "FIRE sampling is not implemented",
             "FIRE sampling is not implemented; the rollouts sample with temperature, top_k "
             "and top_p."),
    _na(f"{ROLLOUT}.calculate_log_probs", "no effect with the hf rollout",
        "the hf rollout samples with the training module itself, so its log-probs are the "
        "old_log_prob node's.", hf_rollout),
    _na((f"{ROLLOUT}.multi_turn.max_turns", f"{ROLLOUT}.multi_turn.use_inference_chat_template",
         f"{ROLLOUT}.multi_turn.tokenization_sanity_check_mode"),
        "no effect: a conversation is one token list",
        "the conversation keeps the model's own tokens and renders tool turns with the "
        "tokenizer's chat template, so nothing is re-tokenized or checked; bound turns with "
        "multi_turn.max_assistant_turns / max_user_turns (max_turns is verl's old name)."),
    _na(tuple(f"{ROLLOUT}.multi_turn.{k}" for k in (
            "max_assistant_turns", "max_user_turns", "tool_config_path",
            "interaction_config_path", "max_parallel_calls", "max_tool_response_length",
            "tool_response_truncate_side", "format")), "no effect: multi-turn is off",
        "multi_turn settings only act with actor_rollout_ref.rollout.multi_turn.enable=true "
        "(max_assistant_turns also in a multi-agent workflow file).",
        lambda config, key: not get(config, f"{ROLLOUT}.multi_turn.enable", False) and not (
            key.endswith("max_assistant_turns") and custom_workflow(config))),
    # -- critic
    _refused("critic.enable", "the workflow decides whether a critic runs",
             "the built-in workflows run a critic exactly for algorithm.adv_estimator=gae "
             "with workflow_type=DEFAULT (PPO): choose the algorithm instead.",
             critic_disagrees),
    _na("critic.enable", "no effect with a custom workflow",
        "a custom workflow's nodes decide whether a critic runs.",
        lambda config, key: custom_workflow(config)),
    _na("critic.model.tokenizer_path", "no effect: the critic reads the actor's tokens",
        "the critic scores the actor's token ids; no second tokenizer is loaded."),
    # -- reward model
    _na(_REWARD_MODEL_KEYS, "no effect without a reward model",
        "reward-model settings only act with reward_model.enable=true.", _rm_off),
    _refused("reward_model.enable", "not with the embodied reward manager",
             "the embodied reward manager scores episodes, not text a reward model could "
             "read: keep reward_model.enable=false with reward_model.reward_manager=embodied.",
             lambda config, key: get(config, "reward_model.reward_manager") == "embodied"),
    _refused("reward_model.strategy", "the reward model runs on fsdp",
             "a Megatron reward model is not implemented: reward_model.strategy=fsdp loads it "
             "with transformers, held whole by each worker or sharded with FSDP2.",
             lambda config, key: str(get(config, key)) == "megatron"),
    _na("reward_model.megatron.*", "no effect: the reward model runs on fsdp",
        "a Megatron reward model is not implemented (reward_model.strategy=megatron is "
        "refused)."),
    _na("reward_model.judge.*", "no effect unless style=generative",
        "judge settings only act with reward_model.style=generative.",
        lambda config, key: not _rm_judge(config, key)),
    _na(_RM_CLASSIFIER_KEYS, "no effect with the generative judge",
        "the judge replies through a rollout engine (its batches: "
        "actor_rollout_ref.rollout.max_num_seqs); sequence-classifier settings do not apply.",
        _rm_judge),
    _na(("reward_model.model.path", "reward_model.model.trust_remote_code",
         "reward_model.model.external_lib"), "no effect: the judge is the rollout engine",
        "with reward_model.judge.source=rollout the policy's rollout engine judges; "
        "reward_model.model.* names a judge of its own with judge.source=model.",
        lambda config, key: _rm_judge(config, key) and
        str(get(config, "reward_model.judge.source", "rollout")) == "rollout"),
    _refused(("reward_model.model.fsdp_config.param_offload",
              "reward_model.model.fsdp_config.offload_policy"),
             "not for the reward model",
             "CPU offload is implemented for the actor, reference and critic (fsdp_config."
             "param_offload); the reward model stays on the GPU: leave it false.",
             _rm_classifier),
    _na("reward_model.model.fsdp_config.optimizer_offload", "no effect: no optimizer",
        "the reward model is frozen: it has no optimizer.", _rm_classifier),
    _na(("reward_model.model.fsdp_config.wrap_policy",
         "reward_model.model.fsdp_config.forward_prefetch"),
        "no effect: FSDP2 shards every decoder layer",
        "FSDP2 here shards each decoder layer and the root (or, with fsdp_size=1, "
        "replicates the whole model); wrapping and prefetch are not tunable.", _rm_classifier),
    _na("reward_model.model.use_remove_padding", "no effect: padded micro-batches",
        "the reward model scores padded micro-batches (the same scores); sequence packing is "
        "implemented for the actor and critic only.", _rm_classifier),
    _na("reward_model.model.use_fused_kernels", "no effect: transformers kernels",
        "fused GPU kernels are not used; the reward model runs with its transformers "
        "implementation."),
    _refused("reward_model.ulysses_sequence_parallel_size", "not for the reward model",
             "the reward model scores whole rows on every worker; Ulysses sequence "
             "parallelism splits the actor's, reference's and critic's sequences only: keep "
             "it at 1.", _rm_classifier),
    _na("reward_model.micro_batch_size", "deprecated: set the *_per_gpu key",
        "verl's deprecated global micro-batch size is not read: set "
        "reward_model.micro_batch_size_per_gpu.", _rm_classifier),
    _na("reward_model.forward_max_token_len_per_gpu", "no effect without dynamic batch size",
        "the token budget only acts with reward_model.use_dynamic_bsz=true.",
        lambda config, key: _rm_classifier(config, key) and
        not get(config, "reward_model.use_dynamic_bsz")),
    _refused("reward_model.sandbox_fusion.url", "serves the multi-turn python tool only",
             "sandbox fusion runs the python tool of multi-turn rollouts "
             "(actor_rollout_ref.rollout.multi_turn.enable=true with a tool config); rewards "
             "do not use it: run code checks in your own custom_reward_function.",
             lambda config, key: not get(config, f"{ROLLOUT}.multi_turn.enable", False)),
    _na("reward_model.sandbox_fusion.*", "no effect without sandbox_fusion.url",
        "it only acts with reward_model.sandbox_fusion.url, for the multi-turn python tool.",
        lambda config, key: not get(config, "reward_model.sandbox_fusion.url") or
        not get(config, f"{ROLLOUT}.multi_turn.enable", False)),
    _na(tuple(f"actor_rollout_ref.embodied.{k}" for k in (
        "embodied_type", "model_path", "embedding_img_size", "embedding_model_class",
        "embedding_model_offload", "num_images_in_input", "center_crop", "unnorm_key",
        "n_gpus_per_node", "temperature", "env.num_trials_per_task", "env.model_family")),
        "read by siiRL's OpenVLA path only",
        "these configure siiRL's OpenVLA models (image preprocessing, action "
        "un-normalisation, their own GPU count); here the model is actor_rollout_ref.model, "
        "its forward takes pixel_values and proprio, sampling uses "
        "actor_rollout_ref.rollout.temperature, and the dataloader's rows name the trials."),
    _na("reward_model.reward_kwargs", "read by the embodied reward manager only",
        "reward_model.reward_kwargs are the embodied manager's keywords (reward_coef); the "
        "other managers take custom_reward_function.reward_kwargs.",
        lambda config, key: get(config, "reward_model.reward_manager") != "embodied"),
    _na("reward_model.launch_reward_fn_async", "no effect: rewards are scored in the step",
        "rewards are scored inside the step; reward_model.reward_manager=parallel scores in "
        "a process pool."),
    # -- verl's reward loop: how verl runs the scoring (its default; every verl reward-model
    #    script sets use_reward_loop)
    _na("reward_model.use_reward_loop", "no effect: one way of scoring",
        "verl switches between its reward loop (asynchronous reward workers, the reward model "
        "served by an inference engine) and its older reward workers; both score the same "
        "rows with the same rules and model. Here the reward node scores each step's rows "
        "with reward_model.reward_manager and, with reward_model.enable, the model at "
        "reward_model.model.path, whichever value this key has."),
    _na("reward_model.num_workers", "no effect unless reward_manager=parallel",
        "reward_model.num_workers is the number of scoring processes of "
        "reward_model.reward_manager=parallel (verl: of its reward-loop workers); the other "
        "managers score the rows one after another.",
        lambda config, key: get(config, "reward_model.reward_manager") != "parallel"),
    _refused("reward_model.enable_resource_pool", "the reward model runs on the workers",
             "verl's standalone mode puts the reward model on GPUs of its own "
             "(reward_model.n_gpus_per_node x nnodes); here each worker scores its rows with "
             "its own copy of the reward model (verl's colocated mode): leave it false."),
    _na(("reward_model.n_gpus_per_node", "reward_model.nnodes"), "no effect: no separate pool",
        "they size verl's separate reward-model pool (reward_model.enable_resource_pool, "
        "refused here); the reward model runs on the training workers."),
    _na("reward_model.rollout.*", "no effect: no reward-model server",
        "they configure the inference server verl's reward loop serves the reward model "
        "with; here the reward model runs inside each worker: a sequence classifier's "
        "forward (reward_model.micro_batch_size_per_gpu, max_length) or, with "
        "style=generative, the judge's replies through a rollout engine (judge.*)."),
    _refused("reward_model.reward_loop_source", "reward managers are registered plugins",
             "verl's importlib source loads a reward-loop manager class from a file (its "
             "RewardManagerBase, run_single on a DataProto), which cannot run here; choose a "
             "registered manager with reward_model.reward_manager (naive, batch, parallel, "
             "dapo, or a package's siirl.reward_managers entry point) and a scoring function "
             "with custom_reward_function.path, or load a manager class written for this "
             "release from a file with reward_manager.source=importlib "
             "(reward_manager.module.path, reward_manager.name); leave this key at register.",
             lambda config, key: str(get(config, key)) != "register"),
    _na(("reward_model.reward_loop_module_path", "reward_model.reward_loop_class_name"),
        "no effect unless reward_loop_source=importlib",
        "verl reads them with reward_model.reward_loop_source=importlib only (refused here: "
        "reward managers are registered plugins)."),
    # -- verl's reward_manager section: reward_manager.source and .name are read
    #    (siirl.params.aliases, siirl.dag_worker.reward_manager_file)
    _na(("reward_manager.module.path", "reward_manager.module.name"),
        "no effect unless reward_manager.source=importlib",
        "reward_manager.module.* name the file a manager class is loaded from with "
        "reward_manager.source=importlib (as in verl); with source=register, "
        "reward_manager.name picks an installed manager.",
        lambda config, key: get(config, "reward_manager.source") != "importlib"),
    _na("reward_manager.module.name", "no effect with a pkg:// module",
        "a pkg:// module is imported under its own dotted name (as in verl).",
        lambda config, key: str(get(config, "reward_manager.module.path") or "")
        .startswith("pkg://")),
    _na("reward_model.profiler.*", "no effect: one profiler for the step",
        "verl profiles each role on its own; here profiler.enable (profiler.profile_steps, "
        "or verl's trainer.profile_steps) traces whole steps, the reward nodes included."),
    _na("reward_model.overlong_buffer.log", "no effect: no separate overlong metrics",
        "the overlong penalty is applied but not logged as separate metrics."),
    # -- trainer
    _na("trainer.balance_batch", "no effect: rows are not reordered by length",
        "rows are not reordered by length across workers: each worker trains on its slice "
        "of the batch (the DataBuffer balances tokens when it moves rows between layouts)."),
    _refused("trainer.default_hdfs_dir", "HDFS upload is not supported",
             "checkpoints are not copied to HDFS; put trainer.default_local_dir on a "
             "filesystem every node shares."),
    _na("trainer.del_local_ckpt_after_load", "no effect: checkpoints are kept",
        "checkpoints are kept after a resume (trainer.max_actor_ckpt_to_keep prunes old "
        "ones)."),
    _na("trainer.max_critic_ckpt_to_keep", "no effect: see max_actor_ckpt_to_keep",
        "actor and critic are saved together in global_step_N/, pruned by "
        "trainer.max_actor_ckpt_to_keep."),
    _na("trainer.ray_wait_register_center_timeout", "no effect: no register center",
        "siirl-train starts the workers itself (trainer.dist_timeout_s bounds their waits)."),
    # -- dag
    _na("dag.enable_perf", "no effect: timings are always logged",
        "per-node timings are always in metrics.jsonl (timing_s/*); profiler.enable runs "
        "the torch profiler."),
    # -- profiler
    _na(("profiler.level", "profiler.with_npu", "profiler.analysis"),
        "no effect: Ascend NPU profiler settings",
        "they tune torch_npu's profiler; this release runs the torch profiler (CPU, and "
        "CUDA where present)."),
)
