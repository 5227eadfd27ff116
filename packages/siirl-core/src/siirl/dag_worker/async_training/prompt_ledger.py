"""Which prompts of the run are done, so that a resumed asynchronous run trains no prompt
twice and loses none.

Prompts are named by their ``sample_id`` (``epoch * len(dataset) + position``: unique over
the run). A prompt is *done* once a trainer trained it or holds it in its buffer (saved
with the checkpoint). After a resume the rollout workers skip the done prompts and
generate every other one again, including those that were in flight at the kill.
The set is kept as sorted ``[start, end)`` intervals: training goes mostly in order, so
it stays a handful of intervals however long the run.
"""

from __future__ import annotations

import bisect
from typing import Iterable, List, Tuple


class PromptLedger:
    def __init__(self, intervals: Iterable[Tuple[int, int]] = ()):
        self.intervals: List[List[int]] = []
        for start, end in intervals:
            self.add_range(int(start), int(end))

    def add(self, ids: Iterable[int]) -> None:
        for i in sorted({int(i) for i in ids}):
            self.add_range(i, i + 1)

    def add_range(self, start: int, end: int) -> None:
        spans = self.intervals
        k = bisect.bisect_left(spans, [start, start])
        if k and spans[k - 1][1] >= start:  # touches the one before
            k -= 1
            start = min(start, spans[k][0])
        j = k
        while j < len(spans) and spans[j][0] <= end:  # swallow those it reaches
            end = max(end, spans[j][1])
            j += 1
        spans[k:j] = [[start, end]]

    def __contains__(self, sample_id: int) -> bool:
        k = bisect.bisect_right(self.intervals, [int(sample_id), float("inf")])
        return bool(k) and self.intervals[k - 1][0] <= sample_id < self.intervals[k - 1][1]

    def first_missing(self) -> int:
        """The smallest id not done (where a resumed rollout starts reading)."""
        spans = self.intervals
        return spans[0][1] if spans and spans[0][0] == 0 else 0

    def count(self) -> int:
        return sum(end - start for start, end in self.intervals)

    def state(self) -> List[Tuple[int, int]]:
        return [(start, end) for start, end in self.intervals]

    def union(self, other: PromptLedger) -> PromptLedger:
        merged = PromptLedger(self.state())
        for start, end in other.state():
            merged.add_range(start, end)
        return merged
