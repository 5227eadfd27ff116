"""``parallel``: score rows in several worker processes, each row with a timeout.

For slow or untrusted scorers (sandboxed code execution, symbolic math that can blow
up): the batch is cut into chunks shared by ``num_workers`` processes. A row whose
function raises, kills its worker or runs past ``timeout_s`` scores 0.0 and the step
goes on; a dead or hung worker is replaced. The built-in rules run in the workers too.

Settings: ``timeout_s`` (constructor) else ``custom_reward_function.reward_kwargs.timeout_s``
else 10 s; ``num_workers`` (constructor) else ``reward_model.num_workers`` (verl's count of
reward-loop workers) else ``min(4, os.cpu_count())``.
"""

from __future__ import annotations

import os
from typing import Any, List, Mapping, Optional

from siirl.engine.common.config import typed_config
from siirl.engine.reward_manager.base import RewardManagerBase
from siirl.engine.reward_manager.outcome import Outcome, Row
from siirl.errors import ConfigError


class ParallelRewardManager(RewardManagerBase):
    """Per-row calls of ``compute_score`` in ``num_workers`` persistent processes."""

    name = "parallel"

    def __init__(self, role: str = "reward", config: Any = None, worker: Any = None,
                 num_workers: Optional[int] = None,
                 peers: Optional[Mapping[str, Any]] = None, **kwargs: Any):
        if num_workers is None and config is not None:
            num_workers = typed_config(config).reward_model.num_workers
        self.num_workers = int(num_workers) if num_workers is not None else \
            min(4, os.cpu_count() or 1)
        if self.num_workers < 1:
            raise ConfigError(f"reward_model.num_workers={self.num_workers} must be at least 1")
        super().__init__(role=role, config=config, worker=worker, peers=peers, **kwargs)

    def _score_rows(self, rows: List[Row], deadline: float) -> List[Outcome]:
        return self.pool.score_rows(rows, deadline)
