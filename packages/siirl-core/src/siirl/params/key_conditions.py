"""The conditions under which a rule of ``siirl.params.key_rules`` holds: each takes the
configuration and the key, and says whether the key is ignored there (a dynamic-sampling
key outside dynamic sampling, a token budget without dynamic batches, ...). Whether the
rollout samples with the actor's own module is what the installed sections declare
(``siirl.params.sections.actor_module_rollout``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from siirl.params.key_paths import value_at

ACTOR, REF = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
Condition = Callable[[Any, str], bool]


def get(config: Any, key: str, default: Any = None) -> Any:
    """``key`` of the typed configuration (the rules name keys by their dotted path)."""
    return value_at(config, key, default)


def custom_workflow(config: Any) -> bool:
    return any(get(config, f"dag.{k}") for k in ("custom_pipeline_fn", "workflow_path",
                                                 "pipeline"))


def builtin_workflow_is_not(kind: str) -> Condition:
    return lambda config, key: not custom_workflow(config) and \
        str(get(config, "algorithm.workflow_type", "DEFAULT")).upper() != kind


def no_dynamic_sampling_possible(config: Any, key: str) -> bool:
    # the DAPO workflow runs it; so does the DEFAULT workflow with group advantages once
    # filter_groups.enable is set, as in verl (siirl.execution.dag.task_loader)
    # asynchronous training: the stream drops the groups, under any workflow
    workflow = str(get(config, "algorithm.workflow_type", "DEFAULT")).upper()
    group_advantages = str(get(config, "algorithm.adv_estimator", "grpo")).lower() != "gae"
    if get(config, "async_training.enable"):
        return not group_advantages
    return not custom_workflow(config) and workflow != "DAPO" and \
        not (workflow == "DEFAULT" and group_advantages)


def no_dynamic_sampling(config: Any, key: str) -> bool:
    if key == "algorithm.filter_groups.enable":  # setting it is what turns it on
        return no_dynamic_sampling_possible(config, key)
    return no_dynamic_sampling_possible(config, key) or (
        not custom_workflow(config) and
        str(get(config, "algorithm.workflow_type", "DEFAULT")).upper() != "DAPO" and
        not get(config, "algorithm.filter_groups.enable"))


BUDGET_SWITCH = {
    f"{ACTOR}.ppo_max_token_len_per_gpu": f"{ACTOR}.use_dynamic_bsz",
    f"{REF}.log_prob_max_token_len_per_gpu": f"{REF}.log_prob_use_dynamic_bsz",
    f"{ROLLOUT}.log_prob_max_token_len_per_gpu": f"{ROLLOUT}.log_prob_use_dynamic_bsz",
    "critic.ppo_max_token_len_per_gpu": "critic.use_dynamic_bsz",
    "critic.forward_max_token_len_per_gpu": "critic.use_dynamic_bsz",
}


def budget_unused(config: Any, key: str) -> bool:
    return not get(config, BUDGET_SWITCH[key])


def critic_disagrees(config: Any, key: str) -> bool:
    # the built-in workflows run a critic exactly for PPO (gae under the DEFAULT or the
    # AGENTIC workflow)
    runs = str(get(config, "algorithm.workflow_type", "DEFAULT")).upper() in (
        "DEFAULT", "AGENTIC") and \
        str(get(config, "algorithm.adv_estimator", "grpo")).lower() == "gae"
    return not custom_workflow(config) and bool(get(config, key)) != runs


def cpu_run(config: Any, key: str) -> bool:
    """``trainer.device=cpu``. Only the setting counts, so the key table reads the same on
    every machine; the validation pass judges the rules on ``siirl.params.machine``'s view,
    where ``auto`` reads ``cpu`` when the workers run on this machine and it shows no GPU.
    Elsewhere (workers on a cluster) the engine refuses with the same text
    (``siirl.engine.fsdp.offload``)."""
    return str(get(config, "trainer.device", "auto")).lower() == "cpu"


def clip_ratio_alone(defaults: Any) -> Condition:
    """``key`` (actor.clip_ratio) is set away from its default while clip_ratio_low and
    clip_ratio_high keep theirs: the PPO loss clips at those two only (verl's as well).
    ``defaults``: the actor's dataclass (its field defaults are the defaults)."""
    default = {f.name: f.default for f in dataclasses.fields(defaults)}

    def alone(config: Any, key: str) -> bool:
        name = key.rsplit(".", 1)[-1]
        return get(config, key) != default[name] and all(
            get(config, f"{key}_{side}") == default[f"{name}_{side}"] for side in ("low", "high"))

    return alone


def remove_padding_off(model_key: str) -> Condition:
    return lambda config, key: not get(config, f"{model_key}.use_remove_padding", False)
