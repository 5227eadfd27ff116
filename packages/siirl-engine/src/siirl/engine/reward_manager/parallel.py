"""``parallel``: score rows in worker processes, each row with a timeout.

For slow or untrusted scorers (sandboxed code execution, symbolic math that can blow
up): a row whose function raises, crashes its worker or runs past ``timeout_s`` scores
0.0 with a warning, and the step goes on; the hung worker is killed and replaced.

Settings: ``timeout_s`` (constructor) else ``custom_reward_function.reward_kwargs.timeout_s``
else 10 s; ``num_workers`` (constructor) else ``min(4, os.cpu_count())``. The schema has
no reward-manager keys for these, hence the ``reward_kwargs`` entry, which is taken out
before the kwargs reach the user's function.
"""

from __future__ import annotations

import os
from typing import Any, List, Mapping, Optional

from siirl.engine.reward_manager._pool import RewardWorkerPool
from siirl.engine.reward_manager.base import Failure, RewardManagerBase
from siirl.engine.reward_manager.registry import register
from siirl.errors import ConfigError

DEFAULT_TIMEOUT_S = 10.0


@register("parallel")
class ParallelRewardManager(RewardManagerBase):
    """Per-row calls of ``compute_score`` in ``num_workers`` spawned processes."""

    name = "parallel"

    def __init__(self, role: str = "reward", config: Any = None, worker: Any = None,
                 timeout_s: Optional[float] = None, num_workers: Optional[int] = None,
                 peers: Optional[Mapping[str, Any]] = None, **kwargs: Any):
        super().__init__(role=role, config=config, worker=worker, peers=peers, **kwargs)
        if timeout_s is None:
            timeout_s = (self.config_timeout_s if self.config_timeout_s is not None
                         else DEFAULT_TIMEOUT_S)
        self.timeout_s = float(timeout_s)
        self.num_workers = int(num_workers or min(4, os.cpu_count() or 1))
        if self.is_default:
            target = ("default",)
        elif self.custom_path:
            # Workers import the file themselves: functions from a file loaded by path
            # cannot be pickled by reference.
            target = ("path", self.custom_path, self.custom_name, self.reward_kwargs)
        else:  # an explicit compute_score: must be an importable module-level function
            target = ("callable", self.compute_score, self.reward_kwargs)
        self._pool = RewardWorkerPool(target, self.num_workers, self.timeout_s)

    def _score_rows(self, data_sources: list, solutions: List[str], ground_truths: list,
                    extra_infos: list) -> List[Any]:
        tasks = list(zip(data_sources, solutions, ground_truths, extra_infos, strict=True))
        results = self._pool.run(tasks)
        for kind, value in results:
            if kind == "config_error":  # raised in the parent, as the in-process managers do
                raise ConfigError(value)
        return [value if kind == "ok" else Failure(kind, value) for kind, value in results]

    def _metrics(self, scores, token_scores, data_sources, counts):
        metrics = super()._metrics(scores, token_scores, data_sources, counts)
        metrics["reward/timeouts"] = float(counts["timeout"])
        return metrics

    def close(self) -> None:
        """Stop the worker processes (they are daemons, so exiting also ends them)."""
        self._pool.close()
