"""What a trainer worker runs in an asynchronous run: the usual training loop (resume,
steps, logging, checkpoints: ``trainer_loop.Trainer``), fed by the rollout workers'
stream instead of a dataloader, and syncing its weights to them every
``async_training.trigger_parameter_sync_step`` steps.

A step takes its share of prompt groups from the queue (waiting for the rollout:
``timing_s/wait_rollout``), drops the groups beyond the staleness bound (their prompts
are generated again: ``async/stale_dropped``), trains on the rest and logs the policy
lag of what it trained (``async/policy_lag/mean|max``). ``timing_s/step`` is the wall
time between two consecutive steps' ends. Checkpoints also hold the queued groups and
which prompts are done, so a resumed run trains no prompt twice and loses none.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

import torch

from siirl.dag_worker.async_training import wire
from siirl.dag_worker.async_training.group_queue import GroupQueue, batch_of, split_groups
from siirl.dag_worker.async_training.prompt_ledger import PromptLedger
from siirl.dag_worker.async_training.prompt_record import PromptRecord
from siirl.dag_worker.async_training.shape import AsyncShape
from siirl.dag_worker.walk.console import Progress
from siirl.dag_worker.walk.quiet_libraries import QuietLibraries
from siirl.dag_worker.walk.tracking import Tracking
from siirl.dag_worker.walk.trainer_loop import Trainer, is_due
from siirl.dag_worker.walk.weight_sync import bucket_bytes_of
from siirl.data_coordinator.fields import TOKEN_POLICY_VERSION

# summed over the rollout calls a step trains from, not averaged
SUMMED = ("timing_s/wait_train",)


class Background:
    """One call at a time on a thread of its own; ``join`` waits for it and raises what it
    raised."""

    def __init__(self, name: str):
        self.name = name
        self._thread: Any = None
        self._error: Any = None

    def start(self, func: Any, *args: Any) -> None:
        def run() -> None:
            try:
                func(*args)
            except BaseException as error:  # raised by join, in the trainer's thread
                self._error = error

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError("the weight sync to the rollout workers failed") from error


def versions_spanned(rows: Any) -> tuple:
    """(samples whose response tokens came from more than one weight version, samples)."""
    versions = rows[TOKEN_POLICY_VERSION]
    valid = versions >= 0
    high = torch.where(valid, versions, torch.full_like(versions, -1)).amax(dim=-1)
    low = torch.where(valid, versions, torch.full_like(versions, 1 << 40)).amin(dim=-1)
    return int(((high > low) & valid.any(dim=-1)).sum()), int(versions.shape[0])


class AsyncTrainer(Trainer):
    def __init__(self, worker: Any, groups: Any, shape: AsyncShape, started_at: Any = None):
        super().__init__(worker, started_at)
        self.groups, self.shape = groups, shape
        self.queue = GroupQueue()
        self.ledger = PromptLedger()  # prompts trained so far
        self.trained: List[int] = []  # since the last sync
        self.dropped: List[int] = []
        self.validations: List[dict] = []
        self.filtered: List[int] = []  # prompts the stream dropped: done, not trained
        self._lock = threading.Lock()
        self._receivers: List[threading.Thread] = []
        self._sender = Background("siirl-weights-out")
        self._last_val = -1

    # -- checkpoint state ------------------------------------------------------------------
    def _trainer_state(self) -> Dict[str, Any]:
        state = super()._trainer_state()
        state["async"] = {"queue": self.queue.state(), "trained": self.ledger.state()}
        return state

    def _restore_extra(self, state: Dict[str, Any]) -> None:
        saved = state.get("async") or {}
        self.ledger = PromptLedger(saved.get("trained", ()))
        self.queue.load(saved.get("queue", []))

    # -- the stream in -----------------------------------------------------------------
    def _receive(self, rollout: int) -> None:
        group = self.groups.pairs[(rollout, self.groups.rank)]
        try:
            while True:
                kind, payload = wire.recv_message(rollout, group)
                if kind == wire.END:
                    self.queue.close_one()
                    return
                if kind == wire.VALIDATION:
                    self.validations.append(payload)
                else:
                    with self._lock:
                        self.filtered.extend(payload.get("filtered", []))
                    if payload["rows"] is not None:  # None: every group was filtered
                        self.queue.put(split_groups(payload["rows"], payload["metrics"]))
        except BaseException as error:
            self.queue.fail(error)

    def _start_receivers(self) -> None:
        for rollout in self.groups.rollouts:
            thread = threading.Thread(target=self._receive, args=(rollout,), daemon=True,
                                      name=f"siirl-rows-from-{rollout}")
            thread.start()
            self._receivers.append(thread)

    # -- the weights out ---------------------------------------------------------------
    def _validation_due(self, step: int, last: bool) -> bool:
        freq = int(self.config.trainer.test_freq or -1)
        if freq <= 0:
            return False
        due = last or step // freq > max(self._last_val, 0) // freq
        if due:
            self._last_val = step
        return due

    def _sync(self, *, validate: bool, stop: bool, first: bool = False) -> Dict[str, float]:
        comm = self.worker.comm
        start = time.perf_counter()
        trained = [i for part in comm.all_gather(self.trained) for i in part]
        dropped = [i for part in comm.all_gather(self.dropped) for i in part]
        self.trained, self.dropped = [], []
        notes = {"version": self.worker.global_step, "trained": trained, "dropped": dropped,
                 "validate": validate, "stop": stop}
        if first:  # a resumed run: the prompts trained or waiting in a queue are done
            done = self.ledger
            queued = [i for part in comm.all_gather(self.queue.sample_ids()) for i in part]
            done = done.union(PromptLedger((i, i + 1) for i in queued))
            done = PromptLedger(r for part in comm.all_gather(done.state()) for r in part)
            # the restored groups: a rollout worker takes them as its own, so one dropped
            # as stale is generated again, like one it generated itself
            notes["done"], notes["queued"] = done.state(), sorted(queued)
        buckets = self.worker.engines.get("actor").export_weights(bucket_bytes_of(self.config))
        weights = self.groups.weights
        self._sender.join()  # the previous sync's broadcast (syncs go out in order)
        if weights is None:  # the export is collective over the trainers; rank 0 sends
            sent = sum(0 for _ in buckets)
        elif weights.data is weights.meta and not stop:
            # gloo (CPU): a snapshot of the weights goes out beside the next step, which
            # changes the weights in place; NCCL broadcasts at once (one stream per group)
            snapshot = [[(name, tensor.detach().clone()) for name, tensor in bucket]
                        for bucket in buckets]
            sent = sum(t.numel() * t.element_size() for b in snapshot for _, t in b)
            self._sender.start(weights.send, snapshot, notes)
        else:
            sent = weights.send(buckets, notes)
        return {"timing_s/weight_sync": time.perf_counter() - start,
                "weight_sync/bytes": float(sent)}

    # -- the loop ----------------------------------------------------------------------
    def _steps_per_epoch(self) -> int:
        loader = self.worker.train_loader  # the rollout's prompts: gen_batch_size a call
        return len(loader) * loader.batch_size * loader.num_ranks // self.shape.step_prompts

    def _step_metrics(self, fresh: List[Any], stale: List[Any], waited: float) -> Dict:
        metrics: Dict[str, float] = {}
        calls = {id(g.metrics): g.metrics for g in fresh}
        for name in {k for m in calls.values() for k in m}:
            values = [float(m[name]) for m in calls.values() if name in m]
            metrics[name] = sum(values) if name in SUMMED else sum(values) / len(values)
        lags = [self.worker.global_step - g.version for g in fresh]
        spans = [versions_spanned(g.rows) for g in fresh if TOKEN_POLICY_VERSION in g.rows.keys()]
        if spans:  # partial rollouts: samples whose tokens came from several weight versions
            partial = sum(s for s, _ in spans)
            metrics["async/partial_ratio"] = partial / max(sum(n for _, n in spans), 1)
        metrics.update({"async/policy_lag/mean": sum(lags) / len(lags),
                        "async/policy_lag/max": float(max(lags)),
                        "async/stale_dropped": float(len(stale)),
                        "async/queue_depth": float(len(self.queue)),
                        "timing_s/wait_rollout": waited})
        return metrics

    def _log_validations(self, tracking: Tracking, history: list) -> None:
        while self.validations:
            found = self.validations.pop(0)
            if found["metrics"]:
                tracking.log(found["step"], found["metrics"])
                history.append({"step": found["step"], **found["metrics"]})

    def _fit(self, quiet: QuietLibraries) -> list:
        worker, config, comm = self.worker, self.config, self.worker.comm
        begun = self._begin(quiet)
        steps, resumed, tracking, health = begun.steps, begun.resumed, begun.tracking, \
            begun.health
        startup_metrics, keep = begun.startup_metrics, begun.keep_through
        record = PromptRecord(config.trainer.default_local_dir, keep, comm.is_chief)
        history: list = []
        progress = None
        pad = getattr(worker.tokenizer, "pad_token_id", None) or 0
        self._start_receivers()
        try:
            self._last_val = worker.global_step
            self._sync(validate=bool(config.trainer.val_before_train) and not resumed
                       and worker.global_step < steps, stop=worker.global_step >= steps,
                       first=True)
            progress = Progress(steps, worker.global_step, enabled=comm.is_chief)
            last_end = loop_start = time.perf_counter()
            while worker.global_step < steps:
                fresh, stale, waited = self.queue.take(
                    self.shape.trainer_share, worker.global_step, self.shape.max_lag,
                    len(self.groups.rollouts))
                self.dropped += [g.sample_id for g in stale]
                metrics = self._step_metrics(fresh, stale, waited)
                worker.global_step += 1  # nodes read the step they run in (as synchronously)
                step = worker.global_step
                with worker.profiler.step(step):
                    result = worker.execute_task_graph(batch_of(fresh, pad))
                ids = [g.sample_id for g in fresh]
                self.trained += ids
                with self._lock:
                    filtered, self.filtered = self.filtered, []
                self.ledger.add(ids + filtered)
                if config.algorithm.filter_groups.enable:
                    metrics["async/groups_filtered"] = float(len(filtered))
                metrics.update(result.metrics)
                last = step == steps
                if step % self.shape.sync_every == 0 or last:
                    metrics.update(self._sync(validate=self._validation_due(step, last),
                                              stop=last))
                end = time.perf_counter()
                metrics["timing_s/step"], last_end = end - last_end, end
                metrics["timing_s/wall"] = end - loop_start
                if startup_metrics:
                    startup_metrics["timing_s/to_first_step"] = time.time() - self.started_at
                    metrics.update(startup_metrics)
                    startup_metrics = {}
                metrics = comm.reduce_metrics(metrics)
                record.write(step, [i for part in comm.all_gather(ids) for i in part])
                health.count_skipped(step, metrics)
                progress.update()
                tracking.log(step, metrics)
                history.append({"step": step, **metrics})
                self._log_validations(tracking, history)
                health.check_rewards(metrics)
                if is_due(step, config.trainer.save_freq, last):
                    self.checkpoints.save(step, self._stateful_engines(),
                                          self._trainer_state(), comm, final=last)
                if comm.is_chief:
                    quiet.announce()
            self._sender.join()
            for thread in self._receivers:  # each ends at its rollout worker's END
                thread.join()
            self._log_validations(tracking, history)
            health.summary()
        finally:
            if progress is not None:
                progress.close()
            tracking.close()
            record.close()
        return history
