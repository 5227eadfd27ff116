"""``batch``: one call of the user function on whole lists (e.g. a batched verifier)."""

from __future__ import annotations

import logging
from typing import Any, List

from siirl.engine.reward_manager.base import Failure, RewardManagerBase
from siirl.engine.reward_manager.registry import register
from siirl.errors import ConfigError

logger = logging.getLogger(__name__)


@register("batch")
class BatchRewardManager(RewardManagerBase):
    """Calls ``fn(data_sources, solution_strs, ground_truths, extra_infos, **reward_kwargs)``
    once per step; it must return one float or dict per row.

    If the call raises, every row scores 0.0 (with one warning); a result of the wrong
    length is a bug in the function and raises ``ConfigError``. Without a custom function
    the built-in rules are applied row by row.
    """

    name = "batch"

    def _score_rows(self, data_sources: list, solutions: List[str], ground_truths: list,
                    extra_infos: list) -> List[Any]:
        if self.is_default:  # the built-in rules are per-row functions
            return self.score_in_process(data_sources, solutions, ground_truths, extra_infos)
        try:
            results = self.compute_score(data_sources, solutions, ground_truths, extra_infos,
                                         **self.reward_kwargs)
        except ConfigError:
            raise  # a setup problem (e.g. an unknown data_source), not a bad sample
        except Exception as exc:  # costs this step's rewards, not the run
            reason = f"{type(exc).__name__}: {exc}"
            logger.warning("batch reward function failed on %d rows, all scored 0.0: %s",
                           len(solutions), reason)
            return [Failure("error", reason, logged=True)] * len(solutions)
        try:
            results = list(results)
        except TypeError as exc:
            raise ConfigError(f"batch reward function {self._fn_label()} returned "
                              f"{type(results).__name__}, expected a list") from exc
        if len(results) != len(solutions):
            raise ConfigError(f"batch reward function {self._fn_label()} returned "
                              f"{len(results)} results for {len(solutions)} rows")
        return results

    def _fn_label(self) -> str:
        where = f" in {self.custom_path}" if self.custom_path else ""
        return f"'{getattr(self.compute_score, '__name__', self.custom_name)}'{where}"
