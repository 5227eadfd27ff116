"""The ``fsdp_config`` section of the fsdp backend: its keys (verl's names and defaults),
where it mounts, and the key rules of its keys. Registered as ``siirl.config: fsdp``; core
mounts it (``siirl.params.sections``) and says, for a role on another strategy, that the
section does not apply. Nothing heavy is imported here: ``siirl-train --help`` reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from siirl.engine.common.lr_schedules import LR_SCHEDULES
from siirl.engine.models.builtin_names import BUILTIN_ASSETS
from siirl.params.key_conditions import cpu_run, get
from siirl.params.key_rule_kinds import Rule, notice, refused
from siirl.params.sections import (
    ConfigSection,
    Mount,
    applying_mounts,
    custom_workflow,
    size,
    workers,
    workers_text,
)
from siirl.params.value_rules import at_least

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
    if mount.selector is None:  # the reward model's rules are the reward model's
        return []
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
        *([notice(f"{_role_prefix(mount)}.optim.override_optimizer_config",
                  "no effect: megatron's optimizer settings",
                  "override_optimizer_config sets fields of megatron-core's OptimizerConfig "
                  "(a role on strategy=megatron); the fsdp roles step torch's AdamW with the "
                  "role's optim keys.")] if has_optimizer else []),
        *([refused(_REPLAY_MODE, "router replay runs on the megatron actor",
                   "router replay R2 records and replays megatron's routing "
                   "(siirl.engine.megatron.router_replay); the fsdp actor's transformers MoE "
                   "layers have no replay: set actor_rollout_ref.actor.strategy=megatron, or "
                   "leave the mode disabled.", lambda config, key: get(config, key) == "R2")]
          if mount.role == "actor" else []),
    ]


_REPLAY_MODE = "actor_rollout_ref.actor.router_replay.mode"


def offload_of_whole_module(prefix: str, offload_key: str) -> str:
    """The refusal of CPU offload with ``fsdp_size=1`` (also the engine's own,
    siirl.engine.fsdp.offload)."""
    key = f"{prefix}.{offload_key}"
    return (f"{key}=true offloads FSDP2 shards, but {prefix}.fsdp_size=1 keeps the whole "
            f"module on every worker; use fsdp_size=-1 to shard it, or set {key}=false")


def _role_prefix(mount: Mount) -> str:
    """The role's group: ``critic`` for ``critic.model.fsdp_config``."""
    return mount.path.rsplit(".", 2)[0] if mount.role == "critic" else mount.parent


def _sequence_parallel_fits(config: Any) -> List[str]:
    """Ulysses groups of s consecutive workers split each sequence (the reference runs in
    the actor's groups): s must divide the workers. The DAGWorker checks it again for a
    graph that only some of the workers run (siirl.dag_worker.walk.layouts)."""
    count, problems = workers(config), []
    for mount in applying_mounts(SECTION, config):
        if mount.role == "reference":
            continue
        key = f"{_role_prefix(mount)}.ulysses_sequence_parallel_size"
        sp = size(config, key)
        if count and sp and count % sp:
            problems.append(f"{key}={sp} must divide {workers_text(count)}: each group "
                            f"of {sp} consecutive workers splits the same sequences")
    return problems


def _sharding_fits(config: Any) -> List[str]:
    """What the engine refuses for a role's fsdp_size over its workers
    (siirl.engine.fsdp.sharding): -1 or the worker count shards over all of them, 1
    replicates; a size in between asks for hybrid sharding, and CPU offload needs shards.
    A custom workflow may give a role fewer workers (independent components): its engines
    check there."""
    count = workers(config)
    if not count or count == 1 or custom_workflow(config):
        return []
    problems = []
    for mount in applying_mounts(SECTION, config):
        prefix = mount.path
        fsdp_size = get(config, f"{prefix}.fsdp_size")
        if not isinstance(fsdp_size, int) or isinstance(fsdp_size, bool) or \
                fsdp_size in (-1, 1, count):
            offload = [k for k in ("param_offload", "optimizer_offload", "offload_policy")
                       if get(config, f"{prefix}.{k}")]
            if fsdp_size == 1 and offload:
                problems.append(offload_of_whole_module(prefix, offload[0]))
            continue
        problems.append(f"{prefix}.fsdp_size={fsdp_size} asks for hybrid sharding (HSDP) over "
                        f"groups of {fsdp_size} of {workers_text(count)}, which the fsdp "
                        "engine does not support; use -1 (shard over all the role's "
                        "workers, the default) or 1 (every worker holds the whole model)")
    return problems


def fsdp_constraints(config: Any) -> List[str]:
    return _sequence_parallel_fits(config) + _sharding_fits(config)


SECTION = ConfigSection(
    schema=FSDPArguments,
    mounts=(
        Mount("actor_rollout_ref.actor.fsdp_config", "actor",
              "actor_rollout_ref.actor.strategy", after="optim"),
        Mount("actor_rollout_ref.ref.fsdp_config", "reference",
              "actor_rollout_ref.ref.strategy", after="strategy"),
        Mount("critic.model.fsdp_config", "critic", "critic.strategy"),
    ),
    applies_to=("fsdp",),
    label="FSDP",
    rules=fsdp_rules,
    constraints=fsdp_constraints,
    value_rules=(at_least(-1, "*.fsdp_config.fsdp_size", " (-1: all workers)"),),
    # siirl-engine's schedules and built-in models (the megatron backend builds and loads
    # the same ones); listed once, here, for the validation pass and --help
    names={"lr_schedules": LR_SCHEDULES, "builtin_models": BUILTIN_ASSETS,
           # verl's strategy=fsdp2 (its FSDP2; its fsdp is FSDP1): this backend is FSDP2
           # (torch's fully_shard), so both name it; the config writes fsdp2 as fsdp
           # (siirl.params.aliases)
           "aliases": ("fsdp2",)},
)
