"""What the trained roles (actor, critic) share whatever the backend: the lr schedule's
life cycle, checkpoints of weights + optimizer + schedule + update count through the
backend, and a weight version that tells a rollout when its copy is stale."""

from __future__ import annotations

from typing import Any, Tuple

from siirl.engine.common.backend import TrainBackend, engine_verb
from siirl.engine.common.optim import build_lr_scheduler
from siirl.engine.common.ppo_update import PPOUpdater
from siirl.errors import ConfigError
from siirl.params import CheckpointArguments, OptimArguments, SiiRLArguments


def planned_steps(cfg: SiiRLArguments, optim_cfg: OptimArguments) -> int:
    """The run length an lr schedule is built for: ``optim.total_training_steps``, else
    ``trainer.total_training_steps`` (-1: not known yet)."""
    steps = optim_cfg.total_training_steps
    if steps is None or steps <= 0:
        steps = cfg.trainer.total_training_steps
    return int(steps or -1)


def initial_scheduler(optimizer: Any, optim_cfg: OptimArguments, steps: int) -> Any:
    """The lr schedule, or None when it needs a run length only the dataloader will know
    (the trainer calls ``set_total_training_steps`` before the first update)."""
    try:
        return build_lr_scheduler(optimizer, optim_cfg, steps)
    except ConfigError:
        return None


class TrainedEngine:
    """Base of the actor and critic engines: ``backend`` trains, ``updater`` counts."""

    def __init__(self, backend: TrainBackend, updater: PPOUpdater, optim_cfg: OptimArguments,
                 checkpoint_cfg: CheckpointArguments):
        self.backend = backend
        self.updater = updater
        self._optim_cfg = optim_cfg
        self._checkpoint_cfg = checkpoint_cfg
        self.pristine = True  # still the loaded weights (no update, no checkpoint load)
        self.weight_version = 0  # bumped whenever the weights change

    @property
    def optimizer(self) -> Any:
        return self.backend.optimizer

    @property
    def lr_scheduler(self) -> Any:
        return self.updater.lr_scheduler

    @property
    def sharded(self) -> bool:
        return bool(getattr(self.backend, "sharded", False))

    @property
    def rank(self) -> int:
        return self.backend.dp_rank

    @property
    def world_size(self) -> int:
        return self.backend.dp_size

    def _scheduler(self) -> Any:
        """The lr schedule; building it here raises the clear error when it needs a run
        length nobody provided (a cosine or ratio-warmup schedule without steps)."""
        if self.updater.lr_scheduler is None:
            self.updater.lr_scheduler = build_lr_scheduler(self.optimizer, self._optim_cfg, -1)
        return self.updater.lr_scheduler

    def set_total_training_steps(self, steps: int) -> None:
        """(Re)build the lr schedule for a run of ``steps`` updates; only before the first
        update, so a schedule already in use is never replaced."""
        scheduler = self.updater.lr_scheduler
        if self.pristine and (scheduler is None or scheduler.last_epoch == 0):
            self.updater.lr_scheduler = build_lr_scheduler(self.optimizer, self._optim_cfg,
                                                           steps)

    def _trained(self) -> None:
        self.pristine = False
        self.weight_version += 1

    def _contents(self, key: str) -> Tuple[str, ...]:
        return tuple(getattr(self._checkpoint_cfg, key) or ("model", "optimizer", "extra"))

    @engine_verb
    def save_checkpoint(self, directory: str) -> None:
        """Weights, optimizer, lr scheduler and update count (``checkpoint.save_contents``)."""
        extra = {"lr_scheduler": self._scheduler().state_dict(),
                 "update_count": self.updater.update_count}
        self.backend.save_checkpoint(directory, extra, self._contents("save_contents"))

    @engine_verb
    def load_checkpoint(self, directory: str) -> None:
        extra = self.backend.load_checkpoint(directory, self._contents("load_contents"))
        if "lr_scheduler" in extra:
            self._scheduler().load_state_dict(extra["lr_scheduler"])
        self.updater.update_count = int(extra.get("update_count", self.updater.update_count))
        self._trained()
