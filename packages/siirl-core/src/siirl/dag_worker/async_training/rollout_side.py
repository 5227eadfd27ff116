"""What a rollout worker runs in an asynchronous run.

It walks its sub-graph (rollout, reward) over its prompts, call after call, and streams
each call's scored groups to the trainer workers (round robin by group), each row tagged
with the policy version that generated it. Weights arrive on a thread of their own and
are loaded between calls. Before each call it checks the freshness budget
(``AsyncShape.outstanding_limit``): with that many prompts generated but not yet
trained it waits for the next sync (``timing_s/wait_train``). A sync's notes say which
prompts were trained (they leave the budget), which were dropped as stale (generated
again first), whether to validate the new weights, and whether the run is over.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator, List, Optional, Set, Tuple

import torch

from siirl.dag_worker.async_training import wire
from siirl.dag_worker.async_training.prompt_ledger import PromptLedger
from siirl.dag_worker.async_training.shape import AsyncShape
from siirl.data_coordinator.fields import POLICY_VERSION, SAMPLE_ID, UID
from siirl.data_coordinator.protocol import get_non_tensor, group_indices, select_rows
from siirl.errors import PipelineError


def with_sample_ids(rows: Any, prompts: Any) -> Any:
    """The rollout's rows with the ``sample_id`` of their prompt: a rollout node that does
    not carry it (the AGENTIC one) names each group by it (``uid``)."""
    if SAMPLE_ID in rows.keys():
        return rows
    asked = {str(i): i for i in prompts[SAMPLE_ID].tolist()}
    uids = get_non_tensor(rows, UID)
    unknown = sorted({u for u in uids if u not in asked})
    if unknown:
        raise PipelineError(f"asynchronous training streams whole prompt groups, but the rows "
                            f"of the rollout sub-graph carry no '{SAMPLE_ID}' and their groups "
                            f"({UID}) {unknown[:3]} name none of the prompts it was given")
    rows.set(SAMPLE_ID, torch.tensor([asked[u] for u in uids], dtype=torch.long))
    return rows


def stream_filter(config: Any) -> Optional[Callable[[Any], Tuple[Any, List[int]]]]:
    """``algorithm.filter_groups.enable`` in an asynchronous run: the stream drops the groups
    whose ``filter_groups.metric`` does not vary (DAPO's dynamic sampling, ROLL's group
    filter); the trainer waits for the next groups instead of regenerating a batch.
    ``rows -> (kept rows, dropped prompts' sample ids)``."""
    settings = config.algorithm.filter_groups
    if not settings.enable:
        return None
    from siirl.dag_worker.nodes.dapo_filter import has_variance
    from siirl.dag_worker.nodes.group_filter import filter_groups, row_values

    metric = settings.metric or "seq_final_reward"

    def apply(rows: Any) -> Tuple[Any, List[int]]:
        kept, _ = filter_groups(rows, row_values(rows, metric), has_variance)
        before = set(rows[SAMPLE_ID].tolist())
        return kept, sorted(before - set(kept[SAMPLE_ID].tolist()))

    return apply


class PromptFeed:
    """Prompts to generate: those handed back first, then the loader's in order, without
    the ones a resumed run has done already."""

    def __init__(self, loader: Any, done: PromptLedger):
        self.loader, self.done = loader, done
        self.again: deque = deque()
        start = done.first_missing()
        rows = len(loader.dataset)
        per_batch = loader.batch_size * loader.num_ranks
        loader.load_state_dict({"epoch": start // rows, "seed": loader.seed,
                                "batches_done": min((start % rows) // per_batch, len(loader))})
        self._batches = self._forever()

    def _forever(self) -> Iterator[Any]:
        while True:
            yield from self.loader

    def next(self, count: int) -> Any:
        if self.again:
            ids = [self.again.popleft() for _ in range(min(count, len(self.again)))]
            return self.loader.batch_of(ids)
        while True:
            batch = next(self._batches)
            keep = [i for i, sample in enumerate(batch[SAMPLE_ID].tolist())
                    if sample not in self.done]
            if len(keep) == len(batch[SAMPLE_ID]):
                return batch
            if keep:
                return select_rows(batch, keep)


class WeightInbox:
    """The weight syncs as they arrive (a thread blocked on the broadcast)."""

    def __init__(self, weights: wire.WeightGroups):
        self.items: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._receive, args=(weights,), daemon=True,
                                        name="siirl-weights-in")
        self._thread.start()

    def _receive(self, weights: wire.WeightGroups) -> None:
        try:
            while True:
                notes, buckets = weights.receive()
                self.items.put((notes, buckets))
                if notes.get("stop"):
                    return
        except BaseException as error:  # handed to the main thread, which raises it
            self.items.put(error)

    def peek(self) -> Optional[tuple]:
        """The next sync without taking it (None: none waits, or the channel failed)."""
        with self.items.mutex:
            item = self.items.queue[0] if self.items.queue else None
        return None if isinstance(item, BaseException) else item

    def get(self, block: bool) -> Optional[tuple]:
        try:
            item = self.items.get(block=block)
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise RuntimeError("the weight sync from the trainer failed") from item
        return item

    def join(self) -> None:
        self._thread.join(timeout=30)


class PauseForWeights:
    """The rollout engine's pause hook for partial rollouts (``async_training.
    partial_rollout``): between two decoding steps the engine asks whether new weights
    wait, and if so has them loaded and goes on under them, each token recording the
    version that sampled it. A sync that asks for validation waits for the end of the
    call (validation runs on that sync's weights, at the same point on every rollout
    worker: it is collective over them)."""

    def __init__(self, loop: AsyncRollout):
        self.loop = loop

    def pending(self) -> bool:
        waiting = self.loop.inbox.peek()
        return waiting is not None and not waiting[0].get("validate")

    def swap(self) -> int:
        notes, buckets = self.loop.inbox.get(block=True)
        self.loop._apply(notes, buckets)  # a stop lets the call finish
        return self.loop.version

    def version(self) -> int:
        return self.loop.version


class AsyncRollout:
    def __init__(self, worker: Any, groups: Any, shape: AsyncShape):
        self.worker, self.groups, self.shape = worker, groups, shape
        self.version = 0
        self.outstanding: Set[int] = set()  # sample ids generated, not yet trained
        self.feed: Optional[PromptFeed] = None
        self.waited = 0.0  # back-pressure since the last call's rows were sent
        self.stop = False
        self.sent_groups = 0
        self.group_filter = stream_filter(worker.config)
        self.inbox: Optional[WeightInbox] = None
        self.place = groups.rollouts.index(groups.rank)  # among the rollout workers

    def run(self) -> None:
        worker = self.worker
        worker.setup()
        engines = worker.engines
        if "actor" in engines:  # its module is the rollout's copy, refreshed by the syncs
            engines.get("actor").trains_module_in_place = False
        inbox = self.inbox = WeightInbox(self.groups.weights)
        if worker.config.async_training.partial_rollout:  # pause calls for new weights
            engines.get("rollout").set_pause_hook(PauseForWeights(self))
        notes, buckets = inbox.get(block=True)
        self.feed = PromptFeed(worker.train_loader, PromptLedger(notes.get("done", ())))
        self._take(notes, buckets)
        while not self.stop:
            item = inbox.get(block=False)
            if item is None and \
                    len(self.outstanding) + self.shape.per_call > self.shape.outstanding_limit:
                start = time.perf_counter()
                item = inbox.get(block=True)  # back-pressure: wait for the trainer
                self.waited += time.perf_counter() - start
            if item is not None:
                self._take(*item)
                continue
            self._generate_and_send()
        for trainer in self.groups.trainers:
            wire.send_message(wire.END, None, trainer, self.groups.pairs[(self.groups.rank,
                                                                         trainer)])
        inbox.join()

    def _take(self, notes: dict, buckets: List[Any]) -> None:
        """A sync between two calls: apply it, then validate when it asks."""
        self._apply(notes, buckets)
        if notes.get("validate"):
            self._validate()

    def _apply(self, notes: dict, buckets: List[Any]) -> None:
        if buckets:
            self.worker.engines.get("rollout").load_weights(buckets)
        self.version = int(notes["version"])
        self.outstanding.difference_update(int(i) for i in notes.get("trained", ()))
        for sample_id in map(int, notes.get("dropped", ())):
            if sample_id in self.outstanding:  # generated again first
                self.outstanding.discard(sample_id)
                self.feed.again.append(sample_id)
        self.stop = bool(notes.get("stop"))

    def _validate(self) -> None:
        from siirl.dag_worker.walk.validator import validate

        worker = self.worker
        if worker.val_loader is None or not worker.can_validate():
            return
        start = time.perf_counter()
        worker.global_step = self.version
        metrics = validate(worker, worker.val_loader)
        if metrics:
            metrics["timing_s/validation"] = time.perf_counter() - start
        if self.place:  # collective: every rollout worker has the metrics, the first sends
            return
        trainer = self.groups.trainers[0]
        wire.send_message(wire.VALIDATION, {"step": self.version, "metrics": metrics},
                          trainer, self.groups.pairs[(self.groups.rank, trainer)])

    def _generate_and_send(self) -> None:
        worker = self.worker
        prompts = self.feed.next(self.shape.per_call)
        version = self.version
        self.outstanding.update(prompts[SAMPLE_ID].tolist())
        # rollout noise is keyed by the step: that of a synchronous run training these
        # samples with these weights (at lag 0 the two runs draw the same samples)
        worker.global_step = version + 1
        result = worker.execute_task_graph(prompts)
        rows = with_sample_ids(next(iter(result.outputs.values())).batch, prompts)
        if POLICY_VERSION not in rows.keys():  # else a partial rollout's oldest token's
            rows.set(POLICY_VERSION, torch.full((rows.batch_size[0],), version,
                                                dtype=torch.long))
        metrics = {k: float(v) for k, v in result.metrics.items() if k != "timing_s/step"}
        metrics["timing_s/wait_train"] = self.waited
        self.waited = 0.0
        filtered: List[int] = []
        if self.group_filter is not None:  # groups whose rewards do not vary teach nothing
            rows, filtered = self.group_filter(rows)
            self.outstanding.difference_update(filtered)  # done: never trained
        trainers = self.groups.trainers
        shares: List[List[int]] = [[] for _ in trainers]
        for index in group_indices(rows, UID).values():
            # round robin, each rollout worker from its own trainer: the trainers' shares of
            # a sync stay even whatever the number of rollout workers
            shares[(self.sent_groups + self.place) % len(trainers)].extend(index)
            self.sent_groups += 1
        for n, (trainer, index) in enumerate(zip(trainers, shares, strict=True)):
            notes = {"filtered": filtered} if n == 0 and filtered else {}
            if index or notes:
                part = rows if len(index) == rows.batch_size[0] else \
                    select_rows(rows, index) if index else None
                wire.send_message(wire.ROWS, {"rows": part, "metrics": metrics, **notes},
                                  trainer, self.groups.pairs[(self.groups.rank, trainer)])
