"""``naive``: score rows one by one in this process."""

from __future__ import annotations

from typing import Any, List

from siirl.engine.reward_manager.base import RewardManagerBase
from siirl.engine.reward_manager.registry import register


@register("naive")
class NaiveRewardManager(RewardManagerBase):
    """The simplest manager: fine for cheap rule-based scorers. A raising function costs
    its row a 0.0 score and a warning; a hanging one hangs the step (use ``parallel``)."""

    name = "naive"

    def _score_rows(self, data_sources: list, solutions: List[str], ground_truths: list,
                    extra_infos: list) -> List[Any]:
        return self.score_in_process(data_sources, solutions, ground_truths, extra_infos)


@register("dapo")
class DAPORewardManager(NaiveRewardManager):
    """verl's ``dapo`` manager: rows scored one by one, with the overlong buffer
    (``reward_model.overlong_buffer``, applied by every manager when enabled) and the
    scorer's ``acc`` column for ``algorithm.filter_groups.metric=acc``."""

    name = "dapo"
