"""The ``embodied`` reward manager: episodes scored by task success, failures by SRPO's
progress reward when the rows carry video embeddings (``reward_score.embodied``).

Reads ``complete`` (0/1 per episode), and, when present, ``trajectory_embedding`` [B, D]
and ``task_id`` (episodes of one task are compared; without it, the GRPO group ``uid``).
The score times ``reward_model.reward_kwargs.reward_coef`` (default 1.0, siiRL's key) sits on
each row's last response token. Without embeddings a failure scores 0 (plain GRPO on
success). With several workers the progress reward compares a failure with its task's
successes on every worker (the global batch), and ``reward/progress/mean`` is the global
batch's mean; ``reward/progress/count`` counts this worker's scored failures (summed over
the workers in the step's metrics).

``reward_model.reward_kwargs.reward=coin_flip`` (a learning control; default ``success``)
pays every episode 0 or 1 by a fair coin instead, whatever it did (failed, succeeded or
ran out of steps; no progress reward), seeded by ``trainer.seed``, the step, the group and
the episode's place in it: a policy trained on it has nothing to learn, so its validation
(which still measures success) should only drift. ``reward=env`` pays each episode the
environment's own rewards summed (``env_scores``): a dense reward where the environment
shapes one (the built-in ``reach`` task's and robosuite's ``reward_shaping``), otherwise
its sparse success reward.
"""

from __future__ import annotations

import math
import random
from typing import Any, Mapping, Optional

import numpy as np
import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.fields import (
    COMPLETE,
    ENV_SCORES,
    RESPONSE_MASK,
    TASK_ID,
    TOKEN_LEVEL_REWARDS,
    TOKEN_LEVEL_SCORES,
    TRAJECTORY_EMBEDDING,
    UID,
)
from siirl.data_coordinator.protocol import get_non_tensor
from siirl.engine.common.config import typed_config
from siirl.engine.reward_score.embodied import progress_rewards
from siirl.errors import ConfigError, DataError
from siirl.execution.dag.node import NodeRole

REWARDS = ("success", "coin_flip", "env")


class EmbodiedRewardManager:
    name = "embodied"

    def __init__(self, role: str = "reward", config: Any = None, worker: Any = None,
                 peers: Optional[Mapping[str, Any]] = None, reward_coef: Optional[float] = None):
        typed = typed_config(config)
        kwargs = dict(typed.reward_model.reward_kwargs or {})
        self.reward_coef = float(reward_coef if reward_coef is not None else
                                 kwargs.get("reward_coef", 1.0))
        self.reward = str(kwargs.get("reward", "success"))
        if self.reward not in REWARDS:
            raise ConfigError(f"reward_model.reward_kwargs.reward={self.reward!r}: the "
                              "embodied reward manager pays success (SRPO's progress for "
                              "failures with video embeddings), env (the environment's "
                              "own rewards summed per episode) or coin_flip (a fair coin "
                              "per episode, a learning control)")
        self.seed = int(typed.trainer.seed or 0)
        self.worker = worker

    def _coins(self, batch: Any, count: int) -> np.ndarray:
        """A fair coin per row, from the run seed, the step, the row's group and its place
        in the group: the same on any number of workers."""
        step = int(getattr(self.worker, "global_step", 0) or 0)
        groups = get_non_tensor(batch, UID) if UID in batch.keys() else ["all"] * count
        seen: dict = {}
        coins = []
        for group in groups:
            place = seen[group] = seen.get(group, -1) + 1
            coins.append(random.Random(f"{self.seed}/{step}/{group}/{place}").random() < 0.5)
        return np.array(coins, dtype=np.float64)

    def _reduction(self) -> Any:
        """Gathers over the workers whose rows make up the batch at the reward node (the
        local no-op for one worker); a tensor-parallel peer's copy of rows adds nothing."""
        from siirl.dag_worker.core_algos.batch_reduction import reduction_for

        graph = getattr(self.worker, "taskgraph", None)
        node = next((n for n in graph.nodes.values() if n.node_role is NodeRole.REWARD),
                    None) if graph is not None else None
        return reduction_for(self.worker, node)

    def compute_reward(self, batch: Any) -> NodeOutput:
        keys = batch.keys()
        if COMPLETE not in keys:
            raise DataError("the embodied reward manager needs each row's 'complete' (task "
                            "success, 0/1) from an embodied rollout; this batch has "
                            f"{sorted(keys)}")
        success = batch[COMPLETE].float().cpu().numpy() > 0.5
        groups = get_non_tensor(batch, TASK_ID) if TASK_ID in keys else \
            get_non_tensor(batch, UID) if UID in keys else ["all"] * len(success)
        metrics = {"reward/success_rate": float(success.mean()) if len(success) else 0.0}
        if self.reward == "coin_flip":
            scores = self._coins(batch, len(success))
        elif self.reward == "env":
            if ENV_SCORES not in keys:
                raise DataError("reward_model.reward_kwargs.reward=env pays the environment's "
                                "rewards summed per episode ('env_scores'), which this "
                                f"batch lacks: it has {sorted(keys)}")
            scores = batch[ENV_SCORES].double().cpu().numpy()
        elif TRAJECTORY_EMBEDDING in keys:
            reduction = self._reduction()
            scores, distances = progress_rewards(
                batch[TRAJECTORY_EMBEDDING].float().cpu().numpy(), success, groups,
                reduction=reduction)
            shaped = [scores[row] for row in distances]
            total, count = reduction.sum([math.fsum(shaped), len(shaped)])
            metrics["reward/progress/mean"] = float(total / count) if count > 0 else 0.0
            metrics["reward/progress/count"] = float(len(shaped))
        else:
            scores = success.astype(np.float64)
        mask = batch[RESPONSE_MASK]
        token_scores = torch.zeros_like(mask, dtype=torch.float32)
        lengths = mask.sum(dim=-1).long()
        rows = torch.nonzero(lengths > 0).flatten()
        values = torch.as_tensor(scores * self.reward_coef, dtype=torch.float32)
        token_scores[rows, lengths[rows] - 1] = values[rows]
        batch.set(TOKEN_LEVEL_SCORES, token_scores)
        batch.set(TOKEN_LEVEL_REWARDS, token_scores.clone())
        metrics["reward/score/mean"] = float(values.mean()) if len(values) else 0.0
        return NodeOutput(batch=batch, metrics=metrics)
