"""``CriticEngine``: the fsdp plugin's engine for role ``critic`` (PPO value function).

Built like the actor engine in ``siirl.engine.fsdp_workers`` (which registers it): the
value model of ``critic.model`` in fp32 on the run's device, FSDP2-sharded over the
worker's critic group when it has more than one rank, its own AdamW (``critic.optim``)
and lr schedule, and checkpoints through ``siirl.engine.checkpoint``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Tuple

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.engine import fsdp_workers as fw
from siirl.engine.actor.dp_actor import compute_dtype
from siirl.engine.critic.dp_critic import DataParallelPPOCritic
from siirl.engine.critic.value_model import build_value_model
from siirl.engine.engine_state import CheckpointedEngine
from siirl.engine.optim import build_lr_scheduler, build_optimizer
from siirl.errors import ConfigError
from siirl.execution.config_select import select

CRITIC = "critic"


class CriticEngine(CheckpointedEngine):
    """Values (``compute_values``), value updates (``update_critic``), checkpoints.

    ``module`` (anything ``value_fn`` can turn into ``[B, R]`` values; by default a
    ``ValueModel``) and ``value_fn`` may be injected (tests, custom models); otherwise the
    value model is built from ``critic.model`` (default: the actor's model).
    """

    def __init__(self, config: Any, worker: Any = None, *,
                 module: Optional[torch.nn.Module] = None, value_fn: Optional[Callable] = None,
                 parallel: Optional[Tuple[int, int, Any]] = None,
                 critic_cls: Callable[..., DataParallelPPOCritic] = DataParallelPPOCritic,
                 **critic_kwargs: Any):
        """``parallel`` = (data-parallel rank, size, group) when the module is parallelised
        by its own means (megatron): no FSDP then; ``critic_cls`` (a DataParallelPPOCritic
        subclass) gets ``critic_kwargs`` (``grad_sync``, ``tp_group``, ...)."""
        self.config, self.worker = config, worker
        self.rank, self.world_size = fw._world(worker)
        if module is None:
            module = build_value_model(select(config, f"{CRITIC}.model"), seed=fw._seed(config))
            module.to(fw._device(config))
        self.module = module
        if parallel is not None:
            self.rank, self.world_size, self.group = parallel
            self.sharded = False
        else:
            self.group = fw._group(worker, CRITIC)
            self.sharded = fw._should_shard(self.group)
        if self.sharded:
            fw.shard_fsdp2(module, select(config, f"{CRITIC}.model.fsdp_config"), self.group)
        self.pristine = True  # no update and no checkpoint load yet
        self._optim_cfg = select(config, f"{CRITIC}.optim")
        optimizer = build_optimizer(module.parameters(), self._optim_cfg)
        try:
            scheduler = build_lr_scheduler(optimizer, self._optim_cfg, self._total_steps())
        except ConfigError:
            scheduler = None  # needs the run's length; see set_total_training_steps
        rollout_n = (select(config, f"{CRITIC}.rollout_n")
                     or select(config, f"{fw.ROLLOUT}.n", 1))
        self.critic = critic_cls(
            module, select(config, CRITIC), optimizer=optimizer, lr_scheduler=scheduler,
            rollout_n=rollout_n, world_size=self.world_size, seed=fw._seed(config),
            value_fn=value_fn,
            autocast_dtype=compute_dtype(select(config, f"{CRITIC}.model.fsdp_config")),
            group=self.group, **critic_kwargs)

    def _total_steps(self) -> int:
        steps = select(self._optim_cfg, "total_training_steps", -1) if self._optim_cfg else -1
        if steps is None or steps <= 0:
            steps = select(self.config, "trainer.total_training_steps", -1)
        return int(steps or -1)

    config_prefix = CRITIC

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.critic.optimizer

    @property
    def trainer(self) -> DataParallelPPOCritic:
        return self.critic

    @property
    def lr_scheduler(self) -> Any:
        return self.critic.lr_scheduler

    def _scheduler(self) -> Any:
        """The lr schedule; building it here raises the clear error when it needs a run
        length nobody provided."""
        if self.critic.lr_scheduler is None:
            self.critic.lr_scheduler = build_lr_scheduler(self.optimizer, self._optim_cfg, -1)
        return self.critic.lr_scheduler

    def set_total_training_steps(self, steps: int) -> None:
        """(Re)build the lr schedule for a run of ``steps`` updates; only before the first
        update, so a schedule already in use is never replaced."""
        if self.pristine and (self.critic.lr_scheduler is None
                              or self.critic.lr_scheduler.last_epoch == 0):
            self.critic.lr_scheduler = build_lr_scheduler(self.optimizer, self._optim_cfg,
                                                          steps)

    def compute_values(self, batch: Any) -> NodeOutput:
        """Adds ``values`` ``[B, R]`` (zero on padding); logs their mean."""
        values = self.critic.compute_values(batch)
        batch.set("values", values)
        metrics = {}
        if "response_mask" in batch.keys():
            mask = batch["response_mask"].float()
            metrics["critic/values/mean"] = float((values * mask).sum()
                                                  / mask.sum().clamp_min(1))
        return NodeOutput(batch=batch, metrics=metrics)

    def update_critic(self, batch: Any) -> NodeOutput:
        start = time.perf_counter()
        self._scheduler()
        metrics = self.critic.update_critic(batch)
        self.pristine = False
        metrics["perf/critic_update_s"] = time.perf_counter() - start
        return NodeOutput(batch=batch, metrics=metrics)
