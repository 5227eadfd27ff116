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

import torch

from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    POLICY_VERSION,
    POSITION_IDS,
    PROMPTS,
    RESPONSES,
    SAMPLE_ID,
    UID,
)
from siirl.data_coordinator.protocol import (
    concat,
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
        # its oldest sample's version (a partial rollout's oldest token's)
        groups.append(Group(part, int(part[POLICY_VERSION].min()), int(part[SAMPLE_ID][0]),
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


FULL = (INPUT_IDS, ATTENTION_MASK, POSITION_IDS)  # prompt then response


def _pad(tensor: torch.Tensor, left: int, right: int, value: int, key: str) -> torch.Tensor:
    if not left and not right:
        return tensor
    parts = [tensor.new_full((*tensor.shape[:-1], left), value)] if left else []
    parts.append(tensor)
    if right:
        if key == POSITION_IDS:  # go on counting after the last position
            step = torch.arange(1, right + 1, dtype=tensor.dtype, device=tensor.device)
            parts.append(tensor[..., -1:] + step)
        else:
            parts.append(tensor.new_full((*tensor.shape[:-1], right), value))
    return torch.cat(parts, dim=-1)


def to_widths(rows: Any, prompt: int, response: int, pad_token_id: int) -> Any:
    """``rows`` with prompts left-padded to ``prompt`` tokens and responses right-padded to
    ``response`` (a rollout call pads only to its own longest; calls differ)."""
    have_p, have_r = rows[PROMPTS].shape[-1], rows[RESPONSES].shape[-1]
    if (have_p, have_r) == (prompt, response):
        return rows
    rows = rows.copy()
    for key in tensor_keys(rows):
        tensor = rows.get(key)
        if tensor.dim() < 2:
            continue
        value = pad_token_id if key in (INPUT_IDS, PROMPTS, RESPONSES) else 0
        width = tensor.shape[-1]
        if key in FULL and width == have_p + have_r:
            rows.set(key, _pad(tensor, prompt - have_p, response - have_r, value, key))
        elif key == PROMPTS:
            rows.set(key, _pad(tensor, prompt - have_p, 0, value, key))
        elif width == have_r:  # a per-response-token field (masks, scores, log-probs)
            rows.set(key, _pad(tensor, 0, response - have_r, value, key))
    return rows


def batch_of(groups: List[Group], pad_token_id: int) -> Any:
    """The groups' rows as one batch, padded to the widest prompt and response."""
    rows = [g.rows for g in groups]
    if PROMPTS not in rows[0].keys() or RESPONSES not in rows[0].keys():
        return concat(rows)
    prompt = max(r[PROMPTS].shape[-1] for r in rows)
    response = max(r[RESPONSES].shape[-1] for r in rows)
    return concat([to_widths(r, prompt, response, pad_token_id) for r in rows])
