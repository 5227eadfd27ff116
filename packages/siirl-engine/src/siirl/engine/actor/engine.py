"""``ActorEngine``: the policy's node-facing engine (role ``actor``), on any backend.

Built by a backend's factory (``siirl.engine.fsdp.engines``, ``siirl.engine.megatron.
engines``), which supplies the backend and its log-prob head. ``module`` is the
transformers model a rollout generates with: the trained module itself on FSDP
(``trains_module_in_place``), an HF copy refreshed by weight sync on megatron.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Optional

import torch

from siirl.dag_worker.core_algos import agg_loss
from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.fields import ATTENTION_MASK, OLD_LOG_PROBS, RESPONSE_MASK
from siirl.engine.actor.dp_actor import DataParallelPPOActor, LogProbHeads
from siirl.engine.actor.on_policy import actor_update_settings, log_prob_budget
from siirl.engine.common.backend import TrainBackend, engine_verb, keep_routing
from siirl.engine.common.dynamic_batch import check_backend
from siirl.engine.common.trained_engine import TrainedEngine, initial_scheduler, planned_steps
from siirl.engine.common.weight_sync import Bucket
from siirl.params import SiiRLArguments


class ActorEngine(TrainedEngine):
    """Log-probs (``compute_log_prob``), updates (``update_policy``), checkpoints, HF
    export and weight export for the rollout."""

    def __init__(self, backend: TrainBackend, cfg: SiiRLArguments, heads: LogProbHeads, *,
                 tokenizer: Any = None, rollout_module: Optional[torch.nn.Module] = None,
                 initial_module: Optional[torch.nn.Module] = None):
        actor_cfg, rollout_cfg = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
        settings = actor_update_settings(cfg, backend.dp_size)
        check_backend(backend, settings.token_budget, log_prob_budget(cfg))
        self.actor = DataParallelPPOActor(
            backend, actor_cfg, heads, temperature=rollout_cfg.temperature,
            log_prob_micro_batch_size=rollout_cfg.log_prob_micro_batch_size_per_gpu,
            log_prob_budget=log_prob_budget(cfg), settings=settings,
            lr_scheduler=initial_scheduler(backend.optimizer, actor_cfg.optim,
                                           planned_steps(cfg, actor_cfg.optim)),
            correction=cfg.algorithm.rollout_correction)
        super().__init__(backend, self.actor.updater, actor_cfg.optim, actor_cfg.checkpoint)
        self.tokenizer = tokenizer
        self.loss_agg_mode = actor_cfg.loss_agg_mode
        self.trains_module_in_place = rollout_module is None
        self.module = backend.module if rollout_module is None else rollout_module
        # A copy of the initial weights taken before sharding, for the reference policy
        # (sharded modules cannot be copied later); handed over, never kept twice.
        self.initial_module = initial_module

    @property
    def trainer(self) -> DataParallelPPOActor:
        return self.actor

    @engine_verb
    def compute_log_prob(self, batch: Any) -> NodeOutput:
        """Adds ``old_log_probs``; logs the rollout policy's entropy as ``actor/entropy``."""
        log_probs, entropy = self.actor.compute_log_prob(batch, calculate_entropy=True)
        batch.set(OLD_LOG_PROBS, log_probs)
        keep_routing(batch, self.backend)  # router replay R2: the update routes the same
        metrics = {}
        # rows all masked out (every group filtered) have no entropy to report, not 0
        if RESPONSE_MASK in batch.keys() and bool(batch[RESPONSE_MASK].any()):
            metrics["actor/entropy"] = float(agg_loss(entropy, batch[RESPONSE_MASK],
                                                      self.loss_agg_mode))
        return NodeOutput(batch=batch, metrics=metrics)

    @engine_verb
    def update_policy(self, batch: Any) -> NodeOutput:
        start = time.perf_counter()
        self._scheduler()
        metrics = self.actor.update_policy(batch)
        self._trained()
        seconds = time.perf_counter() - start
        tokens = float(batch[ATTENTION_MASK].sum()) * self.actor.world_size
        metrics["perf/actor_update_s"] = seconds
        metrics["perf/actor_tokens_per_s"] = tokens / max(seconds, 1e-9)
        return NodeOutput(batch=batch, metrics=metrics)

    @engine_verb
    def export_hf(self, directory: str) -> None:
        """A plain transformers directory (config, safetensors weights, tokenizer)."""
        self.backend.export_hf(directory, self.tokenizer)

    def export_weights(self, bucket_bytes: int) -> Iterator[Bucket]:
        """The policy's HF-named full tensors in buckets (see ``common.weight_sync``)."""
        return self.backend.export_weights(bucket_bytes)
