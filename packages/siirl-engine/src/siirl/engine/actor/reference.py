"""``ReferenceEngine``: the frozen initial policy (role ``reference``), on any backend.

For a LoRA actor the reference is the actor's own module run with its adapters off
(``shares_actor_base``): the frozen base weights are the initial policy.

When neither ``actor.use_kl_loss`` nor ``algorithm.use_kl_in_reward`` is set, nothing
reads ``ref_log_prob``: the planner leaves the reference node out of the plan
(``siirl.execution.dag.planner.reference_needed``, the one statement of that condition), so
no reference is built; a reference engine made anyway holds no model and refuses to run.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.fields import REF_LOG_PROB
from siirl.engine.actor.dp_actor import DataParallelPPOActor, LogProbHeads
from siirl.engine.common.backend import TrainBackend, engine_verb
from siirl.engine.common.dynamic_batch import check_backend
from siirl.engine.common.update_settings import budget
from siirl.engine.models.lora import is_lora
from siirl.errors import PipelineError
from siirl.params import SiiRLArguments


def shares_actor_base(actor: Any) -> bool:
    """Whether the reference is the actor's own module with its LoRA adapters switched off:
    the actor trains adapters over frozen base weights, which stay the initial policy, so
    no copy of them is made."""
    return actor is not None and getattr(actor, "trains_module_in_place", False) and \
        is_lora(getattr(actor, "module", None))


def initial_policy(actor: Any, load: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The policy's initial weights as a module of its own: the copy the actor took before
    sharding (handed over: no second copy), a copy of the actor's module while it still
    holds the loaded weights, else ``load()`` again."""
    if actor is not None and getattr(actor, "initial_module", None) is not None:
        module, actor.initial_module = actor.initial_module, None
        return module
    if actor is not None and actor.pristine and not actor.sharded:
        return copy.deepcopy(actor.module)
    return load()


def reference_micro_batch(cfg: SiiRLArguments) -> Optional[int]:
    ref = cfg.actor_rollout_ref
    return ref.ref.log_prob_micro_batch_size_per_gpu or ref.actor.ppo_micro_batch_size_per_gpu


class ReferenceEngine:
    """``compute_ref_log_prob`` adds ``ref_log_prob``; ``backend`` is None when disabled."""

    def __init__(self, cfg: SiiRLArguments, backend: Optional[TrainBackend] = None,
                 heads: Optional[LogProbHeads] = None):
        self.enabled = backend is not None
        self.backend = backend
        self.module = backend.module if backend is not None else None
        self.actor = None
        if backend is not None:
            ref = cfg.actor_rollout_ref.ref
            limit = budget(ref.log_prob_use_dynamic_bsz, ref.log_prob_max_token_len_per_gpu,
                           "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu")
            check_backend(backend, limit)
            self.actor = DataParallelPPOActor(
                backend, cfg.actor_rollout_ref.actor, heads,
                temperature=cfg.actor_rollout_ref.rollout.temperature,
                log_prob_micro_batch_size=reference_micro_batch(cfg), log_prob_budget=limit)

    @engine_verb
    def compute_ref_log_prob(self, batch: Any) -> NodeOutput:
        if not self.enabled:
            raise PipelineError(
                "the reference engine was built for a run without a KL term "
                "(actor_rollout_ref.actor.use_kl_loss and algorithm.use_kl_in_reward are "
                "false), so it holds no model; the planner leaves the reference node out "
                "then: plan the workflow (siirl.execution.dag.planner.plan_graph) or set a "
                "KL term")
        log_probs, _ = self.actor.compute_log_prob(batch)
        batch.set(REF_LOG_PROB, log_probs)
        return NodeOutput(batch=batch, metrics={})
