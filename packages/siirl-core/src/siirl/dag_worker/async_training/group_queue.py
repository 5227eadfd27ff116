"""A trainer worker's queue of scored prompt groups, as they arrive from the rollout.

Each group keeps the policy version that generated it and the metrics of the rollout
call it came from. A step takes the oldest groups first; a group whose policy lag (the
trainer's weight version minus the group's) is beyond the bound is dropped, never
trained, and its prompt is handed back to be generated again. The queue saves to plain
values (tensors, lists, numbers) so a checkpoint holding it loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    POLICY_VERSION,
    POSITION_IDS,
    PROMPTS,
    SAMPLE_ID,
    UID,
)
from siirl.data_coordinator.protocol import (
    concat_left_padded,
    get_non_tensor,
    group_indices,
    make_batch,
    non_tensor_keys,
    select_rows,
    tensor_keys,
)


@dataclass
class Group:
    rows: Any  # the n scored samples of one prompt (a TensorDict)
    version: int
    sample_id: int
    metrics: Dict[str, float]  # of the rollout call it came from (shared by its groups)


def split_groups(rows: Any, metrics: Dict[str, float]) -> List[Group]:
    groups = []
    for index in group_indices(rows, UID).values():
        part = select_rows(rows, index)
        groups.append(Group(part, int(part[POLICY_VERSION][0]), int(part[SAMPLE_ID][0]),
                            metrics))
    return groups


class GroupQueue:
    def __init__(self) -> None:
        self._groups: deque = deque()
        self._cond = threading.Condition()
        self._closed = 0  # senders that said END
        self.error: Optional[BaseException] = None

    def put(self, groups: List[Group]) -> None:
        with self._cond:
            self._groups.extend(groups)
            self._cond.notify_all()

    def close_one(self) -> None:
        with self._cond:
            self._closed += 1
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self.error = error
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._groups)

    def take(self, count: int, version: int, max_lag: int, senders: int
             ) -> Tuple[List[Group], List[Group], float]:
        """``count`` groups trainable at ``version`` (oldest first), the stale groups
        dropped meanwhile, and the seconds spent waiting for the rollout."""
        fresh: List[Group] = []
        stale: List[Group] = []
        waited = 0.0
        with self._cond:
            while len(fresh) < count:
                if self.error is not None:
                    raise RuntimeError("the rows from a rollout worker stopped arriving") \
                        from self.error
                if self._groups:
                    group = self._groups.popleft()
                    (fresh if version - group.version <= max_lag else stale).append(group)
                    continue
                if self._closed >= senders:
                    raise RuntimeError("every rollout worker ended before the trainer had "
                                       "the prompt groups of its last step")
                start = time.perf_counter()
                self._cond.wait(timeout=1.0)
                waited += time.perf_counter() - start
        return fresh, stale, waited

    def state(self) -> List[dict]:
        """The waiting groups as plain values (for a checkpoint)."""
        with self._cond:
            groups = list(self._groups)
        return [{"tensors": {k: g.rows.get(k) for k in tensor_keys(g.rows)},
                 "values": {k: get_non_tensor(g.rows, k) for k in non_tensor_keys(g.rows)},
                 "version": g.version, "sample_id": g.sample_id,
                 "metrics": dict(g.metrics)} for g in groups]

    def load(self, state: List[dict]) -> None:
        self.put([Group(make_batch(item["tensors"], item["values"]), int(item["version"]),
                        int(item["sample_id"]), dict(item["metrics"])) for item in state])

    def sample_ids(self) -> List[int]:
        with self._cond:
            return [g.sample_id for g in self._groups]


def batch_of(groups: List[Group], pad_token_id: int) -> Any:
    """The groups' rows as one batch (prompts left-padded to one width)."""
    pads = {INPUT_IDS: pad_token_id, PROMPTS: pad_token_id, ATTENTION_MASK: 0,
            POSITION_IDS: 0}
    return concat_left_padded([g.rows for g in groups], pads)
