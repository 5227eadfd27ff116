"""``CriticEngine``: the PPO value function's node-facing engine (role ``critic``), on any
backend. Built by a backend's factory, which supplies the backend (a value model and its
optimizer) and its value head."""

from __future__ import annotations

import time
from typing import Any

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.fields import RESPONSE_MASK, VALUES
from siirl.engine.common.backend import TrainBackend, engine_verb
from siirl.engine.common.config import run_seed
from siirl.engine.common.dp_utils import dp_sum
from siirl.engine.common.dynamic_batch import check_backend
from siirl.engine.common.trained_engine import TrainedEngine, initial_scheduler, planned_steps
from siirl.engine.common.update_settings import UpdateSettings, budget, turn_row_mini_batches
from siirl.engine.critic.dp_critic import DataParallelPPOCritic, ValueHeads
from siirl.params import SiiRLArguments


class CriticEngine(TrainedEngine):
    """Values (``compute_values``), value updates (``update_critic``), checkpoints."""

    def __init__(self, backend: TrainBackend, cfg: SiiRLArguments, heads: ValueHeads):
        critic_cfg = cfg.critic
        train_budget = budget(critic_cfg.use_dynamic_bsz, critic_cfg.ppo_max_token_len_per_gpu,
                              "critic.ppo_max_token_len_per_gpu")
        forward_budget = budget(critic_cfg.use_dynamic_bsz,
                                critic_cfg.forward_max_token_len_per_gpu,
                                "critic.forward_max_token_len_per_gpu")
        check_backend(backend, train_budget, forward_budget)
        settings = UpdateSettings(
            critic_cfg.ppo_mini_batch_size, critic_cfg.ppo_micro_batch_size_per_gpu,
            critic_cfg.ppo_epochs, critic_cfg.shuffle,
            critic_cfg.rollout_n or cfg.actor_rollout_ref.rollout.n, backend.dp_size,
            run_seed(cfg), key_prefix="critic.", token_budget=train_budget,
            mini_batches=turn_row_mini_batches(cfg, critic_cfg.ppo_mini_batch_size))
        self.critic = DataParallelPPOCritic(
            backend, critic_cfg, heads, settings, forward_budget=forward_budget,
            lr_scheduler=initial_scheduler(backend.optimizer, critic_cfg.optim,
                                           planned_steps(cfg, critic_cfg.optim)))
        super().__init__(backend, self.critic.updater, critic_cfg.optim, critic_cfg.checkpoint)
        self.module = backend.module

    @property
    def trainer(self) -> DataParallelPPOCritic:
        return self.critic

    @engine_verb
    def compute_values(self, batch: Any) -> NodeOutput:
        """Adds ``values`` ``[B, R]`` (zero on padding); logs their token mean over every
        data-parallel rank's rows (the whole batch's, as one worker would)."""
        values = self.critic.compute_values(batch)
        batch.set(VALUES, values)
        metrics = {}
        if RESPONSE_MASK in batch.keys():
            mask = batch[RESPONSE_MASK].to(torch.float64)
            backend = self.critic.backend
            sums = dp_sum({"values": float((values.to(torch.float64) * mask).sum()),
                           "tokens": float(mask.sum())},
                          backend.dp_size, backend.dp_group, backend.device)
            metrics["critic/values/mean"] = sums["values"] / max(sums["tokens"], 1.0)
        return NodeOutput(batch=batch, metrics=metrics)

    @engine_verb
    def update_critic(self, batch: Any) -> NodeOutput:
        start = time.perf_counter()
        self._scheduler()
        metrics = self.critic.update_critic(batch)
        self._trained()
        metrics["perf/critic_update_s"] = time.perf_counter() - start
        return NodeOutput(batch=batch, metrics=metrics)
