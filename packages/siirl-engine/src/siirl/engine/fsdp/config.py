"""The ``fsdp_config`` section of the fsdp backend: its keys (verl's names and defaults),
where it mounts, and the key rules of its keys. Registered as ``siirl.config: fsdp``; core
mounts it (``siirl.params.sections``) and says, for a role on another strategy, that the
section does not apply. Nothing heavy is imported here: ``siirl-train --help`` reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from siirl.params.key_conditions import cpu_run
from siirl.params.key_rule_kinds import Rule, notice, refused
from siirl.params.sections import ConfigSection, Mount

# also the engine's own refusal (siirl.engine.fsdp.offload), for engines built without
# the validation pass
OFFLOAD_ON_CPU = ("CPU offload (FSDP2's CPUOffloadPolicy) moves parameters, gradients and "
                  "optimizer state from the GPU to host memory; this run computes on the "
                  "CPU (trainer.device=cpu, or auto where no GPU is visible), so there is "
                  "nothing to offload: leave it false.")


@dataclass
class FSDPArguments:
    """FSDP wrapping, sharding and CPU offload settings."""

    wrap_policy: dict[str, Any] = field(default_factory=lambda: {"min_num_params": 0})
    param_offload: bool = False
    optimizer_offload: bool = False
    offload_policy: bool = False  # fsdp2 only
    reshard_after_forward: bool = True  # fsdp2 only
    forward_prefetch: bool = False
    fsdp_size: int = -1
    model_dtype: str | None = None


def fsdp_rules(mount: Mount) -> List[Rule]:
    """The rules of one role's ``fsdp_config`` where the role runs on fsdp."""
    prefix, has_optimizer = mount.path, mount.role != "reference"
    offload = (f"{prefix}.param_offload", f"{prefix}.offload_policy")
    return [
        refused(offload + ((f"{prefix}.optimizer_offload",) if has_optimizer else ()),
                "no offload on a CPU run", OFFLOAD_ON_CPU, cpu_run),
        *([] if has_optimizer else [notice(f"{prefix}.optimizer_offload", "no effect: no optimizer",
                                          "the reference policy has no optimizer.")]),
        notice((f"{prefix}.wrap_policy", f"{prefix}.forward_prefetch"),
               "no effect: FSDP2 shards every decoder layer",
               "FSDP2 here shards each decoder layer and the root (or, with fsdp_size=1, "
               "replicates the whole model); wrapping and prefetch are not tunable."),
    ]


SECTION = ConfigSection(
    schema=FSDPArguments,
    mounts=(
        Mount("actor_rollout_ref.actor.fsdp_config", "actor",
              "actor_rollout_ref.actor.strategy", after="optim"),
        Mount("actor_rollout_ref.ref.fsdp_config", "reference",
              "actor_rollout_ref.ref.strategy", after="strategy"),
        Mount("critic.model.fsdp_config", "critic", "critic.strategy"),
        # the reward model's rules are the reward model's (siirl.params.reward_key_rules)
        Mount("reward_model.model.fsdp_config", "reward_model"),
    ),
    applies_to=("fsdp",),
    label="FSDP",
    rules=fsdp_rules,
)
