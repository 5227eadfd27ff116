"""The key table's rules for the reward sections: ``reward_model`` (the reward model, its
generative judge or sequence classifier, sandbox fusion, the reward keywords), verl's reward
loop, and verl's ``reward_manager`` section. ``siirl.params.key_rules`` places
``REWARD_RULES`` in the table."""

from __future__ import annotations

from typing import Any, Tuple

from siirl.params.key_conditions import ROLLOUT, get
from siirl.params.key_rule_kinds import Rule, notice, refused

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


REWARD_RULES: Tuple[Rule, ...] = (
    # -- reward model
    notice(_REWARD_MODEL_KEYS, "no effect without a reward model",
           "reward-model settings only act with reward_model.enable=true.", _rm_off),
    refused("reward_model.enable", "not with the embodied reward manager",
            "the embodied reward manager scores episodes, not text a reward model could "
            "read: keep reward_model.enable=false with reward_model.reward_manager=embodied.",
            lambda config, key: get(config, "reward_model.reward_manager") == "embodied"),
    refused("reward_model.strategy", "the reward model runs on fsdp",
            "a Megatron reward model is not implemented: reward_model.strategy=fsdp loads it "
            "with transformers, held whole by each worker or sharded with FSDP2.",
            lambda config, key: str(get(config, key)) == "megatron"),
    notice("reward_model.megatron.*", "no effect: the reward model runs on fsdp",
           "a Megatron reward model is not implemented (reward_model.strategy=megatron is "
           "refused)."),
    notice("reward_model.judge.*", "no effect unless style=generative",
           "judge settings only act with reward_model.style=generative.",
           lambda config, key: not _rm_judge(config, key)),
    notice(_RM_CLASSIFIER_KEYS, "no effect with the generative judge",
           "the judge replies through a rollout engine (its batches: "
           "actor_rollout_ref.rollout.max_num_seqs); sequence-classifier settings do not apply.",
           _rm_judge),
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
           "replicates the whole model); wrapping and prefetch are not tunable.", _rm_classifier),
    notice("reward_model.model.use_remove_padding", "no effect: padded micro-batches",
           "the reward model scores padded micro-batches (the same scores); sequence packing is "
           "implemented for the actor and critic only.", _rm_classifier),
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
    refused("reward_model.sandbox_fusion.url", "serves the multi-turn python tool only",
            "sandbox fusion runs the python tool of multi-turn rollouts "
            "(actor_rollout_ref.rollout.multi_turn.enable=true with a tool config); rewards "
            "do not use it: run code checks in your own custom_reward_function.",
            lambda config, key: not get(config, f"{ROLLOUT}.multi_turn.enable", False)),
    notice("reward_model.sandbox_fusion.*", "no effect without sandbox_fusion.url",
           "it only acts with reward_model.sandbox_fusion.url, for the multi-turn python tool.",
           lambda config, key: not get(config, "reward_model.sandbox_fusion.url") or
           not get(config, f"{ROLLOUT}.multi_turn.enable", False)),
    notice("reward_model.reward_kwargs", "read by the embodied reward manager only",
           "reward_model.reward_kwargs are the embodied manager's keywords (reward_coef); the "
           "other managers take custom_reward_function.reward_kwargs.",
           lambda config, key: get(config, "reward_model.reward_manager") != "embodied"),
    notice("reward_model.launch_reward_fn_async", "no effect: rewards are scored in the step",
           "rewards are scored inside the step; reward_model.reward_manager=parallel scores in "
           "a process pool."),
    # -- verl's reward loop: how verl runs the scoring (its default; every verl reward-model
    #    script sets use_reward_loop)
    notice("reward_model.use_reward_loop", "no effect: one way of scoring",
           "verl switches between its reward loop (asynchronous reward workers, the reward model "
           "served by an inference engine) and its older reward workers; both score the same "
           "rows with the same rules and model. Here the reward node scores each step's rows "
           "with reward_model.reward_manager and, with reward_model.enable, the model at "
           "reward_model.model.path, whichever value this key has."),
    notice("reward_model.num_workers", "no effect unless reward_manager=parallel",
           "reward_model.num_workers is the number of scoring processes of "
           "reward_model.reward_manager=parallel (verl: of its reward-loop workers); the other "
           "managers score the rows one after another.",
           lambda config, key: get(config, "reward_model.reward_manager") != "parallel"),
    refused("reward_model.enable_resource_pool", "the reward model runs on the workers",
            "verl's standalone mode puts the reward model on GPUs of its own "
            "(reward_model.n_gpus_per_node x nnodes); here each worker scores its rows with "
            "its own copy of the reward model (verl's colocated mode): leave it false."),
    notice(("reward_model.n_gpus_per_node", "reward_model.nnodes"), "no effect: no separate pool",
           "they size verl's separate reward-model pool (reward_model.enable_resource_pool, "
           "refused here); the reward model runs on the training workers."),
    notice("reward_model.rollout.*", "no effect: no reward-model server",
           "they configure the inference server verl's reward loop serves the reward model "
           "with; here the reward model runs inside each worker: a sequence classifier's "
           "forward (reward_model.micro_batch_size_per_gpu, max_length) or, with "
           "style=generative, the judge's replies through a rollout engine (judge.*)."),
    refused("reward_model.reward_loop_source", "reward managers are registered plugins",
            "verl's importlib source loads a reward-loop manager class from a file (its "
            "RewardManagerBase, run_single on a DataProto), which cannot run here; choose a "
            "registered manager with reward_model.reward_manager (naive, batch, parallel, "
            "dapo, or a package's siirl.reward_managers entry point) and a scoring function "
            "with custom_reward_function.path, or load a manager class written for this "
            "release from a file with reward_manager.source=importlib "
            "(reward_manager.module.path, reward_manager.name); leave this key at register.",
            lambda config, key: str(get(config, key)) != "register"),
    notice(("reward_model.reward_loop_module_path", "reward_model.reward_loop_class_name"),
           "no effect unless reward_loop_source=importlib",
           "verl reads them with reward_model.reward_loop_source=importlib only (refused here: "
           "reward managers are registered plugins)."),
    # -- verl's reward_manager section: reward_manager.source and .name are read
    #    (siirl.params.aliases, siirl.dag_worker.walk.reward_manager_file)
    notice(("reward_manager.module.path", "reward_manager.module.name"),
           "no effect unless reward_manager.source=importlib",
           "reward_manager.module.* name the file a manager class is loaded from with "
           "reward_manager.source=importlib (as in verl); with source=register, "
           "reward_manager.name picks an installed manager.",
           lambda config, key: get(config, "reward_manager.source") != "importlib"),
    notice("reward_manager.module.name", "no effect with a pkg:// module",
           "a pkg:// module is imported under its own dotted name (as in verl).",
           lambda config, key: str(get(config, "reward_manager.module.path") or "")
           .startswith("pkg://")),
    notice("reward_model.profiler.*", "no effect: one profiler for the step",
           "verl profiles each role on its own; here profiler.enable (profiler.profile_steps, "
           "or verl's trainer.profile_steps) traces whole steps, the reward nodes included."),
    notice("reward_model.overlong_buffer.log", "no effect: no separate overlong metrics",
           "the overlong penalty is applied but not logged as separate metrics."),
)
