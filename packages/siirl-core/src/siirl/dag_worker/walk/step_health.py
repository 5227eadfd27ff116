"""Steps that taught nothing are counted and said, never silent.

* ``train/skipped_steps`` (per step; sum the column for the run): optimizer updates the
  step dropped, over the actor and the critic. The PPO updater drops a mini-batch's
  update when its gradient norm is not finite (``<role>/skipped_steps``), leaving the
  weights and optimizer state as they were. The first time, the console says so and
  which of the step's metrics were not finite; at the end, how many in all.
* A step in which every reward failed (``reward/errors`` equals ``reward/samples``, both
  summed over workers) is a failed step. After ``reward_model.max_failed_steps`` of them
  in a row (0: never) the run stops with the reward engine's ``failed_steps_error``,
  which names the reward function and its last error.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Dict, List, Optional

from siirl.dag_worker.walk.console import write_line
from siirl.errors import SiirlError

SKIPPED = "train/skipped_steps"


class StepHealth:
    def __init__(self, config: Any, reward_engine: Callable[[], Any], chief: bool = True,
                 stream: Any = None):
        self.max_failed_steps = config.reward_model.max_failed_steps or 0
        self.reward_engine = reward_engine  # the reward manager, asked only when stopping
        self.chief = chief
        self.stream = stream
        self.failed_in_a_row = 0
        self.skipped_at: List[int] = []
        self.skipped_total = 0

    def _say(self, line: str) -> None:
        if self.chief:
            write_line(line, self.stream or sys.stderr)

    def count_skipped(self, step: int, metrics: Dict[str, float]) -> None:
        """Add ``train/skipped_steps`` to the step's metrics; explain the first one."""
        by_role = {key.split("/", 1)[0]: int(value) for key, value in metrics.items()
                   if key.endswith("/skipped_steps") and key != SKIPPED
                   and isinstance(value, (int, float)) and math.isfinite(value) and value > 0}
        skipped = sum(by_role.values())
        metrics[SKIPPED] = float(skipped)
        if not skipped:
            return
        if not self.skipped_at:
            roles = ", ".join(f"{role}: {n}" for role, n in sorted(by_role.items()))
            bad = [f"{k}={v}" for k, v in metrics.items()
                   if isinstance(v, float) and not math.isfinite(v)][:6]
            seen = f"; not finite this step: {', '.join(bad)}" if bad else ""
            self._say(f"step {step}: {skipped} optimizer update(s) skipped ({roles}): the "
                      "gradient norm was not finite, so the weights and optimizer state were "
                      f"left as they were{seen}. Skipped updates are counted in {SKIPPED}; "
                      "this is said once.")
        self.skipped_at.append(step)
        self.skipped_total += skipped

    def check_rewards(self, metrics: Dict[str, float]) -> None:
        """Count a step where every reward failed; stop after too many in a row."""
        samples, errors = metrics.get("reward/samples"), metrics.get("reward/errors")
        if not samples or errors is None:
            return  # no reward node this step
        if errors < samples:
            self.failed_in_a_row = 0
            return
        self.failed_in_a_row += 1
        if self.max_failed_steps <= 0 or self.failed_in_a_row < self.max_failed_steps:
            return
        engine = self.reward_engine()
        explain = getattr(engine, "failed_steps_error", None)
        if explain is not None:
            raise explain(self.failed_in_a_row)
        raise SiirlError(f"every reward failed in the last {self.failed_in_a_row} training "
                         f"steps (reward_model.max_failed_steps={self.max_failed_steps}), so "
                         "the run was stopped; the reward warnings above say why")

    def summary(self) -> Optional[str]:
        if not self.skipped_total:
            return None
        steps = ", ".join(map(str, self.skipped_at[:10])) + \
            (", ..." if len(self.skipped_at) > 10 else "")
        line = (f"{self.skipped_total} optimizer update(s) were skipped in this run for a "
                f"non-finite gradient (steps {steps}; see {SKIPPED})")
        self._say(line)
        return line
