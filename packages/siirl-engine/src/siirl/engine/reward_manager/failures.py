"""Failed samples: their 0.0 scores, their counts by kind, one warning per kind.

Metrics of every reward call: ``reward/samples``, ``reward/errors`` (samples that scored
0.0 because their reward failed) and ``reward/errors/<kind>`` for each kind of
``outcome.KINDS``; ``reward/retried`` counts samples of failed ``batch`` calls that were
scored again in smaller calls. The first failure of each kind is logged with its sample
index and error; later ones are only counted, so a broken function cannot flood the log.
The trainer stops the run after ``reward_model.max_failed_steps`` consecutive steps in
which every sample failed (``failed_steps_error`` says why).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

from siirl.engine.reward_manager.outcome import KINDS, Failure, Scored
from siirl.errors import SiirlError

logger = logging.getLogger(__name__)


class RewardFunctionError(SiirlError):
    """The reward function failed on every sample of several consecutive steps."""

    exit_code = 1


class FailureLog:
    """One per reward manager: what has been warned about, and the last failure."""

    def __init__(self, label: str):
        self.label = label  # "compute_score in /path/reward.py"
        self._warned: set = set()
        self.last: Optional[Tuple[int, Any, Failure]] = None  # (sample, data_source, failure)

    def split(self, outcomes: Sequence[Any], data_sources: Sequence[Any]
              ) -> Tuple[List[float], List[Dict[str, Any]], Dict[str, int]]:
        """Scores (0.0 for a failure), extra keys and failure counts by kind."""
        scores, extras = [], []
        counts = dict.fromkeys(KINDS, 0)
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, Scored):
                scores.append(outcome.score)
                extras.append(outcome.extras)
                continue
            if not isinstance(outcome, Failure):  # a bug of a manager, not of the user
                raise TypeError(f"reward outcome of sample {i} is {outcome!r}")
            scores.append(0.0)
            extras.append({})
            counts[outcome.kind] += 1
            self.last = (i, data_sources[i], outcome)
            if outcome.kind not in self._warned:
                self._warned.add(outcome.kind)
                logger.warning(
                    "reward function %s: sample %d (data_source %r) scored 0.0 (%s): %s. "
                    "Every such failure is counted in reward/errors/%s; this is the only "
                    "warning about them.", self.label, i, data_sources[i], outcome.kind,
                    outcome.reason, outcome.kind)
        return scores, extras, counts

    def warn_retry(self, failure: Failure, rows: int) -> None:
        """A ``batch`` call failed and its samples are scored again in halves."""
        key = ("retry", failure.kind)
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("reward function %s: a call on %d samples failed (%s): %s. Its "
                           "samples are scored again in smaller calls, so only the samples "
                           "that fail alone score 0.0 (counted in reward/retried).",
                           self.label, rows, failure.kind, failure.reason)

    @staticmethod
    def metrics(counts: Dict[str, int], samples: int, retried: int = 0) -> Dict[str, float]:
        metrics = {"reward/samples": float(samples),
                   "reward/errors": float(sum(counts.values())),
                   "reward/retried": float(retried)}
        metrics.update({f"reward/errors/{kind}": float(counts[kind]) for kind in KINDS})
        return metrics

    def failed_steps_error(self, steps: int) -> RewardFunctionError:
        """The error that stops a run whose last ``steps`` steps had no scored sample."""
        last = "none recorded"
        if self.last is not None:
            i, source, failure = self.last
            last = f"sample {i} (data_source {source!r}): {failure.kind}: {failure.reason}"
        return RewardFunctionError(
            f"the reward function {self.label} failed on every sample of the last {steps} "
            f"training step(s) (reward_model.max_failed_steps={steps}), so the run was "
            f"stopped: nothing could be learned from these steps. The last error was {last}. "
            "Fix the function (call it on a few of your samples outside siiRL to see the "
            "error), or raise reward_model.max_failed_steps (0: never stop).")
