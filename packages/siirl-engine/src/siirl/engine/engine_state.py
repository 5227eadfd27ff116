"""Checkpointing shared by the trained engines (actor, critic): weights, optimizer, lr
schedule and update count, with ``<role>.checkpoint.save_contents`` / ``load_contents``."""

from __future__ import annotations

from typing import Any, Tuple

from siirl.engine import checkpoint as ckpt
from siirl.execution.config_select import select


class CheckpointedEngine:
    """Mixin: the engine defines ``config_prefix`` (e.g. ``"critic"``), ``module``,
    ``optimizer``, ``_scheduler()``, ``trainer`` (the object counting updates), ``sharded``,
    ``rank``, ``group`` and ``pristine``."""

    config_prefix = ""

    def _contents(self, key: str) -> Tuple[str, ...]:
        return tuple(select(self.config, f"{self.config_prefix}.checkpoint.{key}",
                            ("model", "optimizer", "extra")))

    def save_checkpoint(self, directory: str) -> None:
        """Weights, optimizer, lr scheduler and update count (``checkpoint.save_contents``)."""
        extra: Any = {"lr_scheduler": self._scheduler().state_dict(),
                      "update_count": self.trainer.update_count}
        ckpt.save_checkpoint(directory, self.module, self.optimizer, extra,
                             sharded=self.sharded, rank=self.rank, group=self.group,
                             contents=self._contents("save_contents"))

    def load_checkpoint(self, directory: str) -> None:
        extra = ckpt.load_checkpoint(directory, self.module, self.optimizer,
                                     sharded=self.sharded, group=self.group,
                                     contents=self._contents("load_contents"))
        if "lr_scheduler" in extra:
            self._scheduler().load_state_dict(extra["lr_scheduler"])
        self.trainer.update_count = int(extra.get("update_count", self.trainer.update_count))
        self.pristine = False
