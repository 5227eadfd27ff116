"""The table of configuration keys this release does not read: each rule names keys (dotted,
or fnmatch globs), their class (not applying / refused), a short tag for ``--help`` and why,
with what works instead. ``siirl.params.key_support`` applies it: the first rule that matches
a key and holds decides, so the order matters; keys no rule matches are read. A rule may hold
only under a condition (``when``, from ``key_conditions``); where none holds the key is read.
The rules of the sections that backend, rollout and environment packages register
(``siirl.params.sections``: the general not-applying rule of each, then their own) come
first in ``RULES``; the reward sections' rules (``reward_key_rules``) live in a module of
their own and take their place here.
When an issue implements a key, it deletes the key's rule.
"""

from __future__ import annotations

from typing import Tuple

from siirl.params.async_rules import RULES as ASYNC_RULES
from siirl.params.key_conditions import (
    ACTOR,
    REF,
    ROLLOUT,
    budget_unused,
    builtin_workflow_is_not,
    clip_ratio_alone,
    critic_disagrees,
    custom_workflow,
    get,
    no_dynamic_sampling,
    no_dynamic_sampling_possible,
    remove_padding_off,
)
from siirl.params.key_rule_kinds import NOT_APPLYING, REFUSED, Rule, always, notice, refused
from siirl.params.model_args import ActorArguments
from siirl.params.reward_key_rules import REWARD_RULES
from siirl.params.rollout_correction_rules import RULES as ROLLOUT_CORRECTION_RULES
from siirl.params.sections import actor_module_rollout, section_rules

# the rule types are imported from here as well
__all__ = ["NOT_APPLYING", "REFUSED", "RULES", "Rule", "always"]

_ULYSSES = "ulysses_sequence_parallel_size"


def _replay_refused(config, key: str) -> bool:
    """A router-replay key set to what siiRL does not do: R3, the reference's replay, files."""
    value = get(config, key)
    if key.endswith(".mode"):
        return value not in (("disabled", "R2") if key.startswith("actor_rollout_ref.actor.")
                             else ("disabled",))
    return bool(value)

RULES: Tuple[Rule, ...] = (
    *section_rules(),
    *ASYNC_RULES,
    # -- algorithm
    refused("algorithm.use_pf_ppo", "pf-PPO is not implemented",
            "pf-PPO sample reweighting is not implemented; samples keep equal weights."),
    notice("algorithm.pf_ppo.*", "no effect without use_pf_ppo",
           "it only acts with algorithm.use_pf_ppo=true, which this release refuses."),
    refused("algorithm.filter_groups.enable", "dynamic sampling needs group advantages",
            "dynamic sampling (filter_groups) runs in the DAPO workflow, with group "
            "advantages: it drops groups whose rewards do not vary, which a critic's "
            "advantages (gae) and the AGENTIC/EMBODIED workflows do not use. Use a group "
            "estimator (grpo, ...) under the DEFAULT or DAPO workflow.",
            no_dynamic_sampling_possible),
    notice("algorithm.filter_groups.*", "no effect without dynamic sampling",
           "filter_groups is read by the DAPO workflow (algorithm.workflow_type=DAPO, or "
           "algorithm.filter_groups.enable=true with group advantages).", no_dynamic_sampling),
    notice("algorithm.embodied_sampling.*", "no effect outside the EMBODIED workflow",
           "embodied_sampling is read by the EMBODIED workflow (algorithm.workflow_type=EMBODIED).",
           builtin_workflow_is_not("EMBODIED")),
    *ROLLOUT_CORRECTION_RULES,
    # -- data
    refused("data.tokenizer", "prompts use the model's tokenizer",
            "prompts are tokenized with the policy's tokenizer (actor_rollout_ref.model.path); "
            "leave data.tokenizer null."),
    refused("data.custom_cls.*", "custom dataset classes are not supported",
            "custom dataset classes are not supported: write verl-format parquet or JSON "
            "lines (prompt, data_source, reward_model.ground_truth, ...)."),
    refused("data.sampler.*", "custom samplers are not supported",
            "custom samplers (curricula) are not supported; the training order is a seeded "
            "shuffle (data.shuffle, data.seed)."),
    notice(("data.use_shm", "actor_rollout_ref.model.use_shm"),
           "no effect: files are read in place",
           "copying files to shared memory is not implemented; they are read where they are."),
    refused("data.gen_batch_size", "read by dynamic sampling only",
            "data.gen_batch_size prompts make one generation round of DAPO's dynamic "
            "sampling (algorithm.filter_groups.enable=true); without it every step "
            "generates data.train_batch_size prompts: set that instead.",
            lambda config, key: no_dynamic_sampling(config, key) and
            not get(config, "async_training.enable") and
            get(config, key) != get(config, "data.train_batch_size")),
    notice("data.return_raw_chat", "no effect: the raw chat is always kept",
           "every row keeps its chat messages (raw_prompt) whatever this says; multi-turn and "
           "agentic rollouts read them from there."),
    notice("data.return_raw_input_ids", "no effect: the reward model makes its own inputs",
           "the reward model reads the actor's ids, or (another tokenizer) decodes and "
           "re-tokenises the prompt and response itself: no raw ids are needed."),
    notice("data.return_full_prompt", "no effect: rows keep their chat messages",
           "every row keeps its chat messages (raw_prompt); multi-turn and agentic rollouts "
           "apply the chat template to them themselves."),
    notice("data.validation_shuffle", "no effect: validation covers the whole set",
           "validation scores the whole set, so its order does not change the metrics."),
    notice(("data.dataloader_num_workers", "data.filter_overlong_prompts_workers"),
           "no effect: data is read in the worker process",
           "datasets are read and filtered in the worker process itself."),
    notice(("data.image_key", "data.video_key", "data.return_multi_modal_inputs"),
           "no effect: prompts are text only",
           "multi-modal inputs are not supported; prompts are text only."),
    notice("data.builtin_task", "no effect with train_files and val_files set",
           "the built-in task is written only for data.train_files or data.val_files left "
           "null; both are set, so the files named there are read.",
           lambda config, key: get(config, "data.train_files") is not None and
           get(config, "data.val_files") is not None),
    notice("data.trust_remote_code", "no effect: the tokenizer is the model's",
           "the tokenizer comes with the model and follows "
           "actor_rollout_ref.model.trust_remote_code."),
    # -- policy model
    refused("actor_rollout_ref.hybrid_engine", "the rollout shares the actor's weights",
            "the rollout always samples with the actor's own weights (hybrid engine); a "
            "separate rollout copy is not implemented."),
    notice(("actor_rollout_ref.model.lora_alpha", "actor_rollout_ref.model.target_modules",
            "actor_rollout_ref.model.exclude_modules",
            "actor_rollout_ref.model.lora_merge_on_export"), "no effect without LoRA",
           "LoRA settings only act with actor_rollout_ref.model.lora_rank > 0.",
           lambda config, key: not (get(config, "actor_rollout_ref.model.lora_rank") or 0) > 0),
    refused(("actor_rollout_ref.rollout.enable_rollout_routing_replay",
             "actor_rollout_ref.ref.router_replay.*", "actor_rollout_ref.actor.router_replay.mode",
             "actor_rollout_ref.actor.router_replay.record_file",
             "actor_rollout_ref.actor.router_replay.replay_file"),
            "only R2, the trainer's own routing",
            "router replay R3 (the rollout's expert choices replayed in training) needs a "
            "rollout that reports the experts it routes to, and the vllm, sglang and hf "
            "rollouts here do not; mode=R2 replays the old-log-prob pass's routing in the "
            "update instead (actor_rollout_ref.actor.router_replay.mode=R2, with its routing "
            "kept in the batch, not in record_file / replay_file); the reference routes as "
            "it is.",
            _replay_refused),
    refused("critic.model.lora_rank", "LoRA is built for the actor only",
            "the critic trains all its weights; LoRA adapters are built for the actor "
            "(actor_rollout_ref.model.lora_rank) only: keep critic.model.lora_rank=0."),
    notice(("critic.model.lora_alpha", "critic.model.target_modules"),
           "no effect: the critic has no LoRA",
           "the critic trains all its weights (critic.model.lora_rank is refused)."),
    refused(("actor_rollout_ref.model.enable_activation_offload",
             "critic.model.enable_activation_offload"), "activation offload is not implemented",
            "activation offload is not implemented; enable_gradient_checkpointing "
            "(on by default for GPUs) saves activation memory."),
    notice(("actor_rollout_ref.model.use_liger", "actor_rollout_ref.model.use_fused_kernels",
            "actor_rollout_ref.model.fused_kernel_options"), "no effect: transformers kernels",
           "fused GPU kernels (Liger, verl's fused log-prob kernels) are not used; the model runs "
           "with its transformers implementation."),
    # -- actor loss
    notice(f"{ACTOR}.clip_ratio", "no effect: set clip_ratio_low/high",
           "the PPO loss clips the ratio at 1 - clip_ratio_low and 1 + clip_ratio_high (both "
           "0.2 by default), as verl's does, so clip_ratio alone changes nothing: set "
           f"{ACTOR}.clip_ratio_low and {ACTOR}.clip_ratio_high instead.",
           clip_ratio_alone(ActorArguments)),
    # -- actor / reference / critic batching
    notice((f"{ACTOR}.ppo_micro_batch_size", f"{REF}.log_prob_micro_batch_size",
            f"{ROLLOUT}.log_prob_micro_batch_size", "critic.ppo_micro_batch_size",
            "critic.forward_micro_batch_size"), "deprecated: set the *_per_gpu key",
           "verl's deprecated global micro-batch sizes are not read: set the matching *_per_gpu "
           "key."),
    notice((f"{ACTOR}.ppo_max_token_len_per_gpu", f"{REF}.log_prob_max_token_len_per_gpu",
            f"{ROLLOUT}.log_prob_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu",
            "critic.forward_max_token_len_per_gpu"), "no effect without dynamic batch size",
           "token budgets only act with the matching use_dynamic_bsz=true.", budget_unused),
    refused((f"{ACTOR}.{_ULYSSES}", f"{REF}.{_ULYSSES}"), "needs use_remove_padding=true",
            "Ulysses sequence parallelism splits packed rows: set "
            "actor_rollout_ref.model.use_remove_padding=true (verl requires it as well).",
            remove_padding_off("actor_rollout_ref.model")),
    refused("critic.ulysses_sequence_parallel_size", "needs use_remove_padding=true",
            "Ulysses sequence parallelism splits packed rows: set "
            "critic.model.use_remove_padding=true (verl requires it as well).",
            remove_padding_off("critic.model")),
    refused(f"{REF}.{_ULYSSES}", "the reference runs in the actor's groups",
            "the reference computes in the actor's sequence-parallel groups (its rows are "
            "laid out as the actor's, and it may share the actor's module): set "
            f"{ACTOR}.{_ULYSSES} only.",
            lambda config, key: get(config, key) != get(config, f"{ACTOR}.{_ULYSSES}")),
    notice((f"{ACTOR}.use_torch_compile", f"{REF}.use_torch_compile"),
           "no effect: log-probs run eagerly",
           "torch.compile is not applied; log-probs and entropy run eagerly (same values)."),
    notice((f"{ACTOR}.entropy_from_logits_with_chunking", f"{ACTOR}.entropy_checkpointing",
            f"{REF}.entropy_from_logits_with_chunking", f"{REF}.entropy_checkpointing"),
           "no effect: entropy in one pass",
           "verl's memory savers for the entropy are not used; it is computed in one pass "
           "(same values)."),
    # -- rollout
    # (the engines' own knobs and their rules are siirl-engine's rollout section's;
    # actor_module_rollout: the rollout samples with the actor's module, as sections declare)
    notice(f"{ROLLOUT}.update_weights_bucket_megabytes", "no effect with the hf rollout",
           "vLLM/SGLang engine settings; the hf rollout samples with the actor's own module "
           "(rollout.name=vllm or sglang uses them).", actor_module_rollout),
    notice(f"{ROLLOUT}.dtype", "no effect with the hf rollout",
           "the hf rollout samples with the actor's module, in the actor's dtype.",
           actor_module_rollout),
    notice(f"{ROLLOUT}.prompt_length", "no effect with the hf rollout",
           "the hf rollout takes prompts as the dataloader made them (data.max_prompt_length).",
           actor_module_rollout),
    notice("actor_rollout_ref.actor.policy_drift_coeff", "no effect without the CPGD loss",
           "the policy-drift term belongs to CPGD's loss (algorithm.adv_estimator=cpgd, or "
           "actor_rollout_ref.actor.use_cpgd_loss=true), as in siiRL.",
           lambda config, key: not get(config, "actor_rollout_ref.actor.use_cpgd_loss")),
    refused(f"{ROLLOUT}.model_update_frequency", "needs an engine rollout",
            "the hf rollout samples with the actor's own weights, which every update "
            "changes; a model update frequency needs rollout.name=vllm or sglang.",
            actor_module_rollout),
    refused(f"{ROLLOUT}.response_length", "set data.max_response_length",
            "the rollouts generate data.max_response_length tokens: set that instead."),
    refused("actor_rollout_ref.actor.tis_imp_ratio_cap", "needs an inference-engine rollout",
            "truncated importance sampling weighs the trainer's log-probs against those of "
            "the engine that sampled; the hf rollout samples with the trainer's own module. "
            "Use it with rollout.name=vllm or sglang.", actor_module_rollout),
    refused("actor_rollout_ref.actor.tis_imp_ratio_cap", "needs policy_loss.loss_mode=vanilla",
            "truncated importance sampling is applied by the vanilla PPO loss only (as in "
            "verl).", lambda config, key: str(get(
                config, "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"))
            != "vanilla"),
    refused(f"{ROLLOUT}.use_fire_sampling", "FIRE sampling is not implemented",
            "FIRE sampling is not implemented; the rollouts sample with temperature, top_k "
            "and top_p."),
    # -- critic
    refused("critic.enable", "the workflow decides whether a critic runs",
            "the built-in workflows run a critic exactly for algorithm.adv_estimator=gae "
            "with workflow_type=DEFAULT (PPO): choose the algorithm instead.",
            critic_disagrees),
    notice("critic.enable", "no effect with a custom workflow",
           "a custom workflow's nodes decide whether a critic runs.",
           lambda config, key: custom_workflow(config)),
    notice("critic.model.tokenizer_path", "no effect: the critic reads the actor's tokens",
           "the critic scores the actor's token ids; no second tokenizer is loaded."),
    *REWARD_RULES,
    # -- trainer
    notice("trainer.balance_batch", "no effect: rows are not reordered by length",
           "rows are not reordered by length across workers: each worker trains on its slice "
           "of the batch (the DataBuffer balances tokens when it moves rows between layouts)."),
    refused("trainer.default_hdfs_dir", "HDFS upload is not supported",
            "checkpoints are not copied to HDFS; put trainer.default_local_dir on a "
            "filesystem every node shares."),
    notice("trainer.del_local_ckpt_after_load", "no effect: checkpoints are kept",
           "checkpoints are kept after a resume (trainer.max_actor_ckpt_to_keep prunes old "
           "ones)."),
    notice("trainer.max_critic_ckpt_to_keep", "no effect: see max_actor_ckpt_to_keep",
           "actor and critic are saved together in global_step_N/, pruned by "
           "trainer.max_actor_ckpt_to_keep."),
    notice("trainer.ray_wait_register_center_timeout", "no effect: no register center",
           "siirl-train starts the workers itself (trainer.dist_timeout_s bounds their waits)."),
    # -- dag
    notice("dag.enable_perf", "no effect: timings are always logged",
           "per-node timings are always in metrics.jsonl (timing_s/*); profiler.enable runs "
           "the torch profiler."),
    # -- profiler
    notice(("profiler.level", "profiler.with_npu", "profiler.analysis"),
           "no effect: Ascend NPU profiler settings",
           "they tune torch_npu's profiler; this release runs the torch profiler (CPU, and "
           "CUDA where present)."),
)
