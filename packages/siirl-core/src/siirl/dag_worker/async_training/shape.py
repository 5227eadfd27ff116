"""The numbers an asynchronous run lives by, from ``async_training.*`` (verl's meanings).

* A trainer step trains ``require_batches * actor.ppo_mini_batch_size`` prompt groups.
* The weights go to the rollout every ``trigger_parameter_sync_step`` (k) steps: N = k x
  the step's prompts are consumed between two syncs.
* The rollout keeps at most ``(1 + staleness_threshold) * N`` prompts generated but not
  yet trained (verl's freshness control, counted per rollout worker on its share).
* So a prompt generated under version v is trained by step v + k * (ceil(s) + 1) at the
  latest: the policy lag (trainer weights' version minus the sample's) is at most
  ``k * (ceil(s) + 1) - 1``. A group beyond it (rollout workers racing, a resume) is
  dropped and generated again, never trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from siirl.errors import ConfigError


@dataclass(frozen=True)
class AsyncShape:
    trainers: int
    rollouts: int
    step_prompts: int
    sync_every: int
    staleness: float
    gen_prompts: int  # prompts per generation call, over all rollout workers

    @classmethod
    def of(cls, config: Any) -> AsyncShape:
        from siirl.execution.dag.async_split import worker_counts

        cfg = config.async_training
        trainers, rollouts = worker_counts(config)
        step = int(cfg.require_batches) * int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
        gen = int(config.data.gen_batch_size or step)
        shape = cls(trainers, rollouts, step, int(cfg.trigger_parameter_sync_step),
                    float(cfg.staleness_threshold), gen)
        shape.check()
        return shape

    def check(self) -> None:
        if self.step_prompts % self.trainers:
            raise ConfigError(
                f"async_training.require_batches x actor.ppo_mini_batch_size = "
                f"{self.step_prompts} prompts per trainer step must split evenly over the "
                f"{self.trainers} trainer workers (trainer.nnodes * trainer.n_gpus_per_node)")
        if self.gen_prompts % self.rollouts:
            raise ConfigError(f"data.gen_batch_size={self.gen_prompts} must split evenly over "
                              f"the {self.rollouts} rollout workers")
        if self.gen_prompts > self.limit_total:
            raise ConfigError(
                f"data.gen_batch_size={self.gen_prompts} is more than the rollout may have "
                f"generated ahead of training ((1 + async_training.staleness_threshold) x "
                f"trigger_parameter_sync_step x require_batches x ppo_mini_batch_size = "
                f"{self.limit_total}): lower it or raise the staleness threshold")

    @property
    def prompts_per_sync(self) -> int:
        return self.sync_every * self.step_prompts

    @property
    def limit_total(self) -> int:
        return int(math.floor((1.0 + self.staleness) * self.prompts_per_sync + 1e-9))

    @property
    def outstanding_limit(self) -> int:
        """Prompts one rollout worker may hold generated but not yet trained."""
        return self.limit_total // self.rollouts

    @property
    def per_call(self) -> int:
        return self.gen_prompts // self.rollouts

    @property
    def max_lag(self) -> int:
        return self.sync_every * (math.ceil(self.staleness - 1e-9) + 1) - 1

    @property
    def trainer_share(self) -> int:
        """Prompt groups each trainer worker trains per step."""
        return self.step_prompts // self.trainers
