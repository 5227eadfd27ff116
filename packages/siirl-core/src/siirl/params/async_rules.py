"""Key rules of asynchronous training (``async_training.*``, the rollout pool ``rollout.*``):
what this release does not do yet, and the keys that act only with
``async_training.enable=true``."""

from __future__ import annotations

from typing import Any, Tuple

from siirl.params.key_conditions import get
from siirl.params.key_rule_kinds import Rule, notice, refused

ENABLE = "async_training.enable"


def _off(config: Any, key: str) -> bool:
    return not get(config, ENABLE)


def _on(config: Any, key: str) -> bool:
    return bool(get(config, ENABLE))


def _partial_elsewhere(config: Any, key: str) -> bool:
    """Partial rollouts on an engine that cannot pause a call: the hf rollout and the vllm
    rollout's server pause."""
    name = str(get(config, "actor_rollout_ref.rollout.name"))
    pauses = name == "hf" or (name == "vllm" and not _in_process_vllm(config, key))
    return _on(config, key) and bool(get(config, key)) and not pauses


def _step_differs(config: Any, key: str) -> bool:
    step = int(get(config, "async_training.require_batches") or 1) * \
        int(get(config, "actor_rollout_ref.actor.ppo_mini_batch_size") or 0)
    return _on(config, key) and int(get(config, key) or 0) != step


def _dapo_on(config: Any, key: str) -> bool:
    return _on(config, key) and str(get(config, key) or "").upper() == "DAPO"


def _in_process_vllm(config: Any, key: str) -> bool:
    rollout = "actor_rollout_ref.rollout"
    mode = str(get(config, f"{rollout}.mode") or "sync").lower()
    return _on(config, key) and str(get(config, f"{rollout}.name")) == "vllm" and \
        mode not in ("server", "async")


def _megatron_reward_model(config: Any, key: str) -> bool:
    return _on(config, key) and bool(get(config, "reward_model.enable")) and \
        str(get(config, key)) == "megatron"


RULES: Tuple[Rule, ...] = (
    notice(("async_training.staleness_threshold", "async_training.trigger_parameter_sync_step",
            "async_training.require_batches", "async_training.partial_rollout",
            "rollout.nnodes", "rollout.n_gpus_per_node"),
           "no effect without async_training.enable",
           "asynchronous training is off (async_training.enable=false): rollout and training "
           "take turns on every worker.", _off),
    refused("async_training.partial_rollout", "partial rollouts need hf or the vllm server",
            "only the built-in hf rollout and the vllm server (rollout.name=vllm with "
            "rollout.mode=server) pause a generation call for new weights and go on under "
            "them; with another engine a sync waits for the current call (keep "
            "data.gen_batch_size small to keep that wait short).", _partial_elsewhere),
    refused("algorithm.workflow_type", "dynamic sampling runs in the stream",
            "with async_training.enable=true the rollout drops the groups whose rewards do "
            "not vary as they stream (algorithm.filter_groups.enable=true, under the DEFAULT "
            "or AGENTIC workflow) and the trainer waits for the next ones: use "
            "algorithm.workflow_type=DEFAULT with filter_groups.enable=true.", _dapo_on),
    refused("reward_model.strategy", "a megatron reward model needs trainer workers",
            "megatron's parallel state is laid over the trainer workers, and with "
            "async_training.enable=true the reward model scores on the rollout workers: use "
            "reward_model.strategy=fsdp (the trainers may still train on megatron).",
            _megatron_reward_model),
    refused("data.train_batch_size", "a step is require_batches mini-batches",
            "with async_training.enable=true a trainer step trains async_training."
            "require_batches x actor_rollout_ref.actor.ppo_mini_batch_size prompts (verl's "
            "meaning); set data.train_batch_size to that product (verl ignores it).",
            _step_differs),
)
