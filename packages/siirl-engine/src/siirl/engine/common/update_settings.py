"""The batch arithmetic of a role's update and of a forward pass, with no torch.

The PPO updater (``ppo_update``) and verl's dynamic batch size (``dynamic_batch``) run on
these settings; the planner, in the driver process that imports no torch, reads them too
to decide whether the actor's update gives the old log-probs itself
(``siirl.engine.actor.on_policy``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from siirl.errors import ConfigError


@dataclass(frozen=True)
class TokenBudget:
    """At most ``max_tokens`` real tokens per micro-batch (``key`` names the setting)."""

    max_tokens: int
    key: str


def budget(enabled: Any, max_tokens: Any, key: str) -> Optional[TokenBudget]:
    """A TokenBudget when ``enabled`` (a use_dynamic_bsz setting), else None."""
    if not enabled:
        return None
    if int(max_tokens or 0) < 1:
        raise ConfigError(f"{key}={max_tokens} must be at least 1 with dynamic batch size")
    return TokenBudget(int(max_tokens), key)


@dataclass
class UpdateSettings:
    """The batch arithmetic of one role's update (checked once, at construction)."""

    mini_batch_prompts: int  # ppo_mini_batch_size
    micro_batch_rows: int  # ppo_micro_batch_size_per_gpu; 0: the whole mini-batch
    epochs: int = 1
    shuffle: bool = False
    rollout_n: int = 1
    world_size: int = 1  # data-parallel size
    seed: int = 0
    key_prefix: str = ""  # where the keys live, for messages: "" (actor) or "critic."
    token_budget: Optional[TokenBudget] = None  # use_dynamic_bsz: micro-batches by tokens
    # > 0: the rows are not rollout.n per prompt (turn rows): every update takes this many
    # optimizer steps, each on an equal share of the rows (the last may be smaller)
    mini_batches: int = 0

    def __post_init__(self) -> None:
        self.mini_batch_prompts, self.epochs = int(self.mini_batch_prompts), int(self.epochs)
        self.micro_batch_rows = int(self.micro_batch_rows or 0)
        self.rollout_n, self.world_size = int(self.rollout_n), int(self.world_size)
        self.mini_batches = int(self.mini_batches or 0)
        if self.epochs < 1:
            raise ConfigError(f"{self.key_prefix}ppo_epochs={self.epochs} must be at least 1")
        if self.micro_batch_rows < 0:
            raise ConfigError(f"{self.key_prefix}ppo_micro_batch_size_per_gpu="
                              f"{self.micro_batch_rows} must not be negative")

    def mini_batch_rows(self) -> int:
        """Rows per mini-batch on this rank (verl: prompts * rollout.n / data-parallel size)."""
        rows = self.mini_batch_prompts * self.rollout_n // self.world_size
        if rows < 1:
            raise ConfigError(f"{self.key_prefix}ppo_mini_batch_size={self.mini_batch_prompts}"
                              f" * rollout.n={self.rollout_n} is smaller than the "
                              f"data-parallel size {self.world_size}")
        return rows

    def rows_per_mini_batch(self, rows: int) -> int:
        """How many of an update's ``rows`` one mini-batch takes."""
        if self.mini_batches > 0:
            return max(1, math.ceil(rows / self.mini_batches))
        return self.mini_batch_rows()

    def micro_rows(self) -> int:
        mini = self.mini_batch_rows()
        micro = self.micro_batch_rows or mini
        if self.token_budget is not None or self.mini_batches > 0:
            return micro  # micro-batches cut by tokens, or of rows whose count varies
        if mini % micro:
            what = "critic " if self.key_prefix else ""
            raise ConfigError(f"the per-rank {what}mini-batch ({mini} rows) must be a multiple "
                              f"of {self.key_prefix}ppo_micro_batch_size_per_gpu={micro}")
        return micro


def turn_row_mini_batches(cfg: Any, mini_batch_prompts: int) -> int:
    """``UpdateSettings.mini_batches`` of a run: AGENTIC ``env_manager.mode=step`` makes a
    row per turn, as many as the episodes took, so a size in rows would cut the step into
    a number of optimizer steps that depends on the worker count; 0 for sample rows."""
    if str(cfg.algorithm.workflow_type).upper() != "AGENTIC" or \
            str(cfg.env_manager.mode or "trajectory").lower() != "step":
        return 0
    return max(1, int(cfg.data.train_batch_size) // max(int(mini_batch_prompts), 1))
