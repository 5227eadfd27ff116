"""Facts about the shape of a run that core's checks and the sections' rules and
constraints ask (``siirl.params.sections``): how many workers, which roles run. They read the
typed configuration by dotted key; a value out of its range reads as unknown (None), since
``value_rules`` names it."""

from __future__ import annotations

from typing import Any, Optional

from siirl.params.key_paths import value_at
from siirl.params.mini_batch_layout import critic_trains


def size(config: Any, key: str) -> Optional[int]:
    """The value of ``key`` when it is a usable size (an int >= 1), else None."""
    value = value_at(config, key)
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return value if ok else None


def workers(config: Any) -> Optional[int]:
    """trainer.nnodes x trainer.n_gpus_per_node (None where either is not a size)."""
    nodes, per_node = size(config, "trainer.nnodes"), size(config, "trainer.n_gpus_per_node")
    return nodes * per_node if nodes and per_node else None


def workers_text(count: int) -> str:
    return f"the number of workers ({count} = trainer.nnodes x trainer.n_gpus_per_node)"


def custom_workflow(config: Any) -> bool:
    """A workflow of the user's own (its nodes decide which roles run and where)."""
    return any(value_at(config, f"dag.{k}") for k in ("custom_pipeline_fn", "workflow_path",
                                                     "pipeline"))


def role_runs(config: Any, role: str) -> bool:
    """Whether the built-in workflows run ``role``: the actor always, the reference where a
    KL term needs it, the critic where it trains; other roles: yes."""
    if role == "reference":
        return bool(value_at(config, "actor_rollout_ref.actor.use_kl_loss") or
                    value_at(config, "algorithm.use_kl_in_reward"))
    if role == "critic":
        return critic_trains(config)
    return True
