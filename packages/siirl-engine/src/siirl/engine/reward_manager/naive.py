"""``naive``: one call per sample; the user's function runs in one worker process."""

from __future__ import annotations

from typing import List

from siirl.engine.reward_manager.base import RewardManagerBase
from siirl.engine.reward_manager.outcome import Outcome, Row


class NaiveRewardManager(RewardManagerBase):
    """The simplest manager, fine for cheap rule-based scorers. The built-in rules run in
    this process; a custom function runs in one persistent worker process that scores the
    whole batch per call, each sample within ``timeout_s``."""

    name = "naive"

    def _score_rows(self, rows: List[Row], deadline: float) -> List[Outcome]:
        if self.custom_path:
            return self.pool.score_rows(rows, deadline)
        return self.score_in_process(rows)


class DAPORewardManager(NaiveRewardManager):
    """verl's ``dapo`` manager: rows scored one by one, with the overlong buffer
    (``reward_model.overlong_buffer``, applied by every manager when enabled) and the
    scorer's ``acc`` column for ``algorithm.filter_groups.metric=acc``."""

    name = "dapo"
