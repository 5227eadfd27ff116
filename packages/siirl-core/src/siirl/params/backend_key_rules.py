"""The key table's rules for each role's backend section: its ``fsdp_config`` (``fsdp_rules``)
and its ``megatron`` section (``megatron_rules``). ``siirl.params.key_rules`` places them in
the table for the actor, the reference and the critic."""

from __future__ import annotations

from typing import List

from siirl.params.key_conditions import ACTOR, cpu_run, differs_from_actor, get, strategy_is
from siirl.params.key_rule_kinds import Rule, notice, refused

# also the fsdp engine's own refusal, for engines built without the validation pass
OFFLOAD_ON_CPU = ("CPU offload (FSDP2's CPUOffloadPolicy) moves parameters, gradients and "
                  "optimizer state from the GPU to host memory; this run computes on the "
                  "CPU (trainer.device=cpu, or auto where no GPU is visible), so there is "
                  "nothing to offload: leave it false.")
_MEGATRON_OFFLOAD = ("megatron CPU offload is not implemented; parameters and optimizer "
                     "state stay on the GPU (on a GPU run strategy=fsdp offloads with "
                     "fsdp_config.param_offload; a CPU run has nothing to offload).")
_MIRRORED = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
             "virtual_pipeline_model_parallel_size", "sequence_parallel")
# refused for every role by the validation pass (constraints.megatron_size_problems) and the
# megatron engine: no rule may suggest it
NO_CONTEXT_PARALLEL = ("context parallelism is not supported by this release (it needs "
                       "Transformer Engine's attention)")


def fsdp_rules(prefix: str, strategy_key: str, has_optimizer: bool) -> List[Rule]:
    offload = (f"{prefix}.param_offload", f"{prefix}.offload_policy")
    return [
        notice(f"{prefix}.*", "no effect with strategy=megatron",
               f"FSDP settings do not apply when {strategy_key}=megatron.",
               strategy_is(strategy_key, megatron=True)),
        refused(offload + ((f"{prefix}.optimizer_offload",) if has_optimizer else ()),
                "no offload on a CPU run", OFFLOAD_ON_CPU, cpu_run),
        *([] if has_optimizer else [notice(f"{prefix}.optimizer_offload", "no effect: no optimizer",
                                          "the reference policy has no optimizer.")]),
        notice((f"{prefix}.wrap_policy", f"{prefix}.forward_prefetch"),
               "no effect: FSDP2 shards every decoder layer",
               "FSDP2 here shards each decoder layer and the root (or, with fsdp_size=1, "
               "replicates the whole model); wrapping and prefetch are not tunable."),
    ]


def megatron_rules(prefix: str, strategy_key: str, role: str) -> List[Rule]:
    rules = [notice(f"{prefix}.*", "no effect unless strategy=megatron",
                    f"megatron settings apply only when {strategy_key}=megatron.",
                    strategy_is(strategy_key, megatron=False))]
    if role != "actor":
        rules += [
            refused(tuple(f"{prefix}.{k}" for k in _MIRRORED), "set it under actor.megatron",
                    f"the {role} runs in the actor's megatron parallel state: set the same "
                    f"key under {ACTOR}.megatron instead.", differs_from_actor),
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
    return rules + [
        refused((f"{prefix}.param_offload",) + (optimizer_offload if role != "reference"
                                                else ()), "megatron offload is not implemented",
                _MEGATRON_OFFLOAD),
        notice(optimizer_offload, "no effect: no optimizer", "the reference has no optimizer."),
        refused((f"{prefix}.expert_model_parallel_size", f"{prefix}.expert_tensor_parallel_size"),
                "expert parallelism is not supported",
                "expert parallelism is not supported: the megatron bridge builds dense "
                "Llama/Qwen2 models."),
        refused(f"{prefix}.use_dist_checkpointing", "models are built from HF weights",
                "the megatron model is always built from the Hugging Face weights of the "
                "model path; starting from a megatron dist checkpoint is not supported."),
        notice(f"{prefix}.dist_checkpointing_path", "no effect without use_dist_checkpointing",
               "it only acts with use_dist_checkpointing=true, which this release refuses."),
        refused(f"{prefix}.override_transformer_config", "overrides are not applied",
                "the TransformerConfig is derived from the Hugging Face config; change that "
                "through actor_rollout_ref.model.override_config instead."),
        notice(f"{prefix}.seed", "no effect: seeded from trainer.seed",
               "megatron's RNG is seeded from trainer.seed."),
        notice(f"{prefix}.use_mbridge", "no effect: siiRL's own bridge converts weights",
               "siiRL's own bridge converts Hugging Face weights (Llama, Qwen2)."),
    ]

