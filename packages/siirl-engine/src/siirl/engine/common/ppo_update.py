"""The PPO update loop, written once for the actor and the critic on every backend.

``ppo_epochs`` passes over the batch (shuffled per pass when ``shuffle``, seeded by the
update count so a resumed run shuffles like an uninterrupted one), mini-batches of
``ppo_mini_batch_size * rollout.n / data-parallel size`` rows, each one optimizer step
over micro-batches of ``ppo_micro_batch_size_per_gpu`` rows run by the backend's
``forward_backward_batch``. Rows that are not ``rollout.n`` samples per prompt (AGENTIC
``env_manager.mode=step``: one row per turn) are cut into a number of mini-batches
instead, ``data.train_batch_size / ppo_mini_batch_size``, as episode rows would be: the
same optimizer steps on any number of workers (``mini_batches``). A step whose gradient
norm is not finite is skipped, so one bad batch cannot poison weights or optimizer moments.

Metrics: a :class:`MiniBatchLoss` adds each micro-batch's share of the mini-batch value to
``totals``; they are averaged over mini-batches and summed over data-parallel ranks, so
they read as one process computing on the whole batch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Dict, List, Optional, Protocol

import torch

from siirl.data_coordinator.fields import RESPONSE_MASK
from siirl.data_coordinator.protocol import split
from siirl.engine.common.backend import Head, MicroLoss, TrainBackend
from siirl.engine.common.dp_utils import dp_sum
from siirl.engine.common.dynamic_batch import Micro, count, token_plan
from siirl.engine.common.update_settings import TokenBudget, UpdateSettings

_TOKENS = "_trained_tokens"  # summed over ranks beside the metrics, then dropped


class MiniBatchLoss(Protocol):
    """A role's loss plug-in (policy loss, value loss)."""

    def bind(self, mini_batch: Any, num_micro: int, totals: Dict[str, float]) -> MicroLoss:
        """The loss of one micro-batch of ``mini_batch``, weighted by its share of the
        global mini-batch; metric shares go to ``totals``."""


class PPOUpdater:
    """Runs updates of ``backend``'s model; counts them (checkpointed by the engine) and
    steps the lr schedule once per update."""

    def __init__(self, backend: TrainBackend, settings: UpdateSettings, metric_prefix: str,
                 lr_scheduler: Any = None):
        self.backend = backend
        self.settings = settings
        self.prefix = metric_prefix
        self.lr_scheduler = lr_scheduler
        self.update_count = 0

    def update(self, data: Any, head: Head, loss: MiniBatchLoss) -> Dict[str, float]:
        """Every epoch's mini-batch steps over ``data``; the update's metrics."""
        backend, settings = self.backend, self.settings
        mini, micro = settings.rows_per_mini_batch(data.batch_size[0]), settings.micro_rows()
        generator = None
        if settings.shuffle:
            generator = torch.Generator().manual_seed(settings.seed + self.update_count)
        lr = float(backend.optimizer.param_groups[0]["lr"])
        backend.module.train()
        stats: Dict[str, List[float]] = defaultdict(list)
        skipped = 0
        for _ in range(settings.epochs):
            epoch_data = data
            if generator is not None:
                epoch_data = data[torch.randperm(data.batch_size[0], generator=generator)]
            for mini_batch in split(epoch_data, mini):
                skipped += not self._step(mini_batch, micro, head, loss, stats)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.update_count += 1
        grad_key = f"{self.prefix}/grad_norm"
        grad_norms = stats.pop(grad_key, None)
        metrics = {key: sum(values) / len(values) for key, values in stats.items()}
        if RESPONSE_MASK in data.keys():
            metrics[_TOKENS] = float(data[RESPONSE_MASK].sum())
        # each rank holds its share of the global value
        metrics = dp_sum(metrics, backend.dp_size, backend.dp_group, backend.device)
        engine_metrics = getattr(backend, "take_update_metrics", None)  # megatron's MoE router
        if engine_metrics is not None:
            metrics.update(engine_metrics(self.prefix))
        if metrics.pop(_TOKENS, None) == 0.0:  # every row masked out (all groups filtered):
            metrics.pop(f"{self.prefix}/entropy", None)  # no token has an entropy to report
        # the grad norm is global already, so every rank skips the same steps; nan when
        # every step was skipped
        metrics[grad_key] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        metrics[f"{self.prefix}/skipped_steps"] = float(skipped)
        metrics[f"{self.prefix}/lr"] = lr
        return metrics

    def _step(self, mini_batch: Any, micro: Micro, head: Head, loss: MiniBatchLoss,
              stats: Dict[str, List[float]]) -> bool:
        """Accumulate over micro-batches, clip, step; False if the step was skipped."""
        backend = self.backend
        mini_batch = mini_batch.to(backend.device)
        totals: Dict[str, float] = defaultdict(float)
        if self.settings.token_budget is not None:
            micro = token_plan(mini_batch, self.settings.token_budget, backend.dp_group,
                               backend.dp_size)
        loss_fn = loss.bind(mini_batch, count(mini_batch.batch_size[0], micro), totals)
        backend.zero_grad()
        backend.forward_backward_batch(mini_batch, micro, head, loss_fn)
        for key, value in totals.items():
            stats[key].append(value)
        grad_norm = backend.optimizer_step()
        if not math.isfinite(grad_norm):
            return False
        stats[f"{self.prefix}/grad_norm"].append(grad_norm)
        return True


class UpdatingRole:
    """Base of the actor and critic roles: their backend, and the optimizer, lr schedule
    and update count a checkpoint holds (``updater`` is None for a forward-only role)."""

    def __init__(self, backend: TrainBackend, updater: Optional[PPOUpdater]):
        self.backend = backend
        self.updater = updater

    @property
    def optimizer(self) -> Any:
        return self.backend.optimizer

    @optimizer.setter
    def optimizer(self, value: Any) -> None:
        self.backend.optimizer = value

    @property
    def lr_scheduler(self) -> Any:
        return self.updater.lr_scheduler if self.updater is not None else None

    @lr_scheduler.setter
    def lr_scheduler(self, value: Any) -> None:
        self.updater.lr_scheduler = value

    @property
    def update_count(self) -> int:
        return self.updater.update_count if self.updater is not None else 0

    @update_count.setter
    def update_count(self, value: int) -> None:
        self.updater.update_count = int(value)

    @property
    def module(self) -> torch.nn.Module:
        return self.backend.module

    @property
    def world_size(self) -> int:
        return self.backend.dp_size

    def mini_batch_rows(self) -> int:
        return self.updater.settings.mini_batch_rows()


def forward_rows(backend: TrainBackend, data: Any, micro_rows: Optional[int],
                 head: Head, token_budget: Optional[TokenBudget] = None
                 ) -> Dict[str, torch.Tensor]:
    """The head's outputs for every row of ``data`` (no gradients), on the CPU; with a
    ``token_budget`` (dynamic batch size) in micro-batches cut by tokens."""
    rows = data.batch_size[0]
    micro: Micro = int(micro_rows or rows or 1)
    if token_budget is not None:
        micro = token_plan(data, token_budget, backend.dp_group, backend.dp_size)
    backend.module.eval()
    with torch.no_grad():
        return backend.forward_backward_batch(data, micro, head, forward_only=True)
