"""``batch``: one call of the user function on whole lists (e.g. a batched verifier).

The function runs in a persistent worker process. When a call fails as a whole (it
raises, exits, crashes or runs past ``timeout_s``), its samples are scored again in two
halves, and so on down to single samples (``isolate``), so only the samples that fail
alone score 0.0; ``reward_model.step_timeout_s`` bounds the whole search, and samples
not isolated by then take the failure of the call they were in.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, List, Sequence

from siirl.engine.reward_manager.base import RewardManagerBase
from siirl.engine.reward_manager.outcome import Failure, Outcome, Row, call_batch
from siirl.errors import ConfigError

BatchCall = Callable[[Sequence[Row], float], Any]  # (rows, deadline) -> outcomes | Failure


class BatchRewardManager(RewardManagerBase):
    """Calls ``fn(data_sources, solution_strs, ground_truths, extra_infos, **reward_kwargs)``
    on the step's rows; it must return one float or dict per row. A result that is no list
    of that length is a bug in the function and raises ``ConfigError``. Without a custom
    function the built-in rules are applied row by row, in this process.
    """

    name = "batch"
    default_timeout_s = 60.0  # per call; a call scores the whole batch (or a part of it)

    def _score_rows(self, rows: List[Row], deadline: float) -> List[Outcome]:
        if self.is_default:  # the built-in rules are per-row functions
            return self.score_in_process(rows)
        if self.custom_path:
            call: BatchCall = self.pool.call_batch
        else:  # a function object handed to the constructor: in this process
            def call(part: Sequence[Row], _deadline: float) -> Any:
                return call_batch(self.compute_score, part, self.reward_kwargs)
        return self.isolate(call, rows, deadline)

    def isolate(self, call: BatchCall, rows: List[Row], deadline: float) -> List[Outcome]:
        """Outcomes of ``rows``, splitting failed calls in halves until the failing
        samples stand alone or the deadline passes."""
        out: List[Any] = [None] * len(rows)
        spans = deque([(0, len(rows), None)])  # (start, end, failure of the enclosing call)
        while spans:
            lo, hi, failed = spans.popleft()
            if lo == hi:
                continue
            if time.monotonic() >= deadline:
                out[lo:hi] = [_unisolated(failed)] * (hi - lo)
                continue
            result = call(rows[lo:hi], deadline)
            if isinstance(result, tuple):  # ("bad_result", message)
                raise ConfigError(f"batch reward function {self.function_label()} "
                                  f"{result[1]}")
            if not isinstance(result, Failure):
                out[lo:hi] = result
                if failed is not None:
                    self._retried += hi - lo
            elif hi - lo == 1:
                out[lo] = result
            else:
                self.failures.warn_retry(result, hi - lo)
                mid = (lo + hi) // 2
                spans.extendleft([(mid, hi, result), (lo, mid, result)])
        return out


def _unisolated(failed: Any) -> Failure:
    why = "the step's time for rewards (reward_model.step_timeout_s) ran out"
    if failed is None:
        return Failure("timeout", f"{why} before this sample was scored")
    return Failure(failed.kind, f"{failed.reason} (in a call on several samples; {why} "
                                "before they could be scored one by one)")
