"""The training loop one worker runs: steps over its dataloader, validation, checkpoints.

Order within a step (kept fixed so a resumed run replays an uninterrupted one exactly):
run the graph -> validate if due -> log -> checkpoint if due. Resuming restores engine
state, dataloader position, RNG states and algorithm state from the newest committed
checkpoint (``trainer.resume_mode=auto``) or ``trainer.resume_from_path``. With
``trainer.val_only`` the loop validates the loaded (or resumed) policy once and returns.

Every worker of a multi-worker job runs this same loop in step with the others: step
metrics are combined over workers (``worker.comm``) and logged once by rank 0, which also
shows progress, picks the checkpoint to resume from and commits checkpoints.

The first step a process runs also records its start-up: ``timing_s/setup`` (engines,
data, resume) and ``timing_s/to_first_step`` (from the job's start to the end of that
step; ``tools/bench/startup.py`` reads them).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional

import numpy as np
import torch

from siirl.dag_worker.checkpoint.manager import (
    STATEFUL_ROLES,
    CheckpointManager,
    rng_state,
    set_rng_state,
)
from siirl.dag_worker.walk import generations, startup
from siirl.dag_worker.walk.console import Progress
from siirl.dag_worker.walk.profiling import StepProfiler
from siirl.dag_worker.walk.quiet_libraries import QuietLibraries
from siirl.dag_worker.walk.step_budget import StepBudget
from siirl.dag_worker.walk.step_health import StepHealth
from siirl.dag_worker.walk.tracking import Tracking, build_tracking
from siirl.dag_worker.walk.validator import validate
from siirl.errors import ConfigError


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def configure_threads(config: Any) -> None:
    """On CPU, tiny models lose more to thread hand-offs than they gain (0.26 s vs 5.4 s per
    default step measured on 2 busy cores): use ``trainer.cpu_threads``."""
    threads = config.trainer.cpu_threads
    on_cpu = config.trainer.device == "cpu" or \
        not torch.cuda.is_available()
    if threads and on_cpu:
        torch.set_num_threads(int(threads))


def is_due(step: int, freq: Any, last: bool) -> bool:
    """Whether a every-``freq``-steps action (validation, a save) runs after ``step``."""
    freq = int(freq or -1)
    return freq > 0 and (step % freq == 0 or last)


def _throughput(batch: Any, seconds: float) -> Dict[str, float]:
    if batch is None or not hasattr(batch, "keys") or "attention_mask" not in batch.keys():
        return {}
    tokens = float(batch["attention_mask"].sum())
    return {"perf/total_num_tokens": tokens, "perf/throughput": tokens / max(seconds, 1e-9)}


@dataclass
class Begun:
    """What ``Trainer._begin`` set up for the loop."""

    steps: int
    resumed: bool
    keep_through: int  # the resumed step (records after it are redone), or -1
    startup_metrics: Dict[str, float]
    tracking: Tracking
    health: StepHealth


class Trainer:
    def __init__(self, worker: Any, started_at: Optional[float] = None):
        """``started_at``: when the job started (``time.time()``; default: when this
        process did), for ``timing_s/to_first_step``."""
        self.worker = worker
        self.config = worker.config
        self.started_at = startup.process_started() if started_at is None else started_at
        # the torch profiler around chosen steps or nodes (profiler.*)
        worker.profiler = StepProfiler(self.config, getattr(getattr(worker, "comm", None),
                                                            "rank", 0))
        trainer = self.config.trainer
        self.checkpoints = CheckpointManager(trainer.default_local_dir,
                                             trainer.max_actor_ckpt_to_keep)

    def _stateful_engines(self) -> Dict[str, Any]:
        agents = getattr(self.worker, "agents", None)
        if agents is not None:  # every agent group's (a multi-agent workflow has several)
            return agents.stateful(STATEFUL_ROLES)
        return {role: self.worker.engines.get(role) for role in STATEFUL_ROLES
                if role in self.worker.engines}

    def _trainer_state(self) -> Dict[str, Any]:
        loader = self.worker.train_loader
        return {"global_step": self.worker.global_step, "rng": rng_state(),
                "dataloader": loader.state_dict() if loader is not None else None,
                "algorithm": self.worker.algorithm_state()}

    def _maybe_resume(self) -> bool:
        mode, path = self.config.trainer.resume_mode, self.config.trainer.resume_from_path
        if mode == "resume_path" and not path:
            raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        # auto: the newest intact checkpoint (a damaged one is skipped with a warning)
        found = self.checkpoints.restore(
            self._stateful_engines(), self.worker.comm, mode=mode, path=path,
            needs_dataloader=self.worker.train_loader is not None)
        if found is None:
            return False
        path, state = found
        self.worker.global_step = int(state["global_step"])
        if state.get("dataloader") is not None and self.worker.train_loader is not None:
            self.worker.train_loader.load_state_dict(state["dataloader"])
        self.worker.load_algorithm_state(state.get("algorithm") or {})
        self._restore_extra(state)
        set_rng_state(state["rng"])
        if self.worker.comm.is_chief:
            print(f"resumed from {path} at step {self.worker.global_step}", flush=True)
        return True

    def _restore_extra(self, state: Dict[str, Any]) -> None:
        """What a loop of another kind keeps in its checkpoints (asynchronous training:
        its buffered prompt groups)."""

    def _reward_engine(self) -> Any:
        engines = getattr(self.worker, "engines", None)
        return engines.get("reward") if engines is not None and "reward" in engines else None

    def _batches(self):
        loader = self.worker.train_loader
        while True:
            if loader is None:
                yield None
                continue
            yield from loader  # a restored loader continues mid-epoch, then the next epochs

    def _dump_generations(self, step: int, outputs: Dict[str, Any]) -> None:
        """``trainer.rollout_data_dir``: this step's rows as text (``generations``)."""
        folder = self.config.trainer.rollout_data_dir
        if not folder or not outputs:
            return
        node_id, output = next(iter(outputs.items()))
        holds = getattr(self.worker, "holds_rows_of", lambda _: True)(node_id)
        comm = self.worker.comm
        generations.dump(generations.lines(output.batch, self.worker.tokenizer) if holds
                         else [], folder, step, comm.rank, comm.world_size)

    def _validate(self) -> Dict[str, float]:
        if self.worker.val_loader is None or not self.worker.can_validate():
            return {}
        start = time.perf_counter()
        metrics = validate(self.worker, self.worker.val_loader)
        if metrics:
            metrics["timing_s/validation"] = time.perf_counter() - start
        return metrics

    def _validate_only(self, tracking: Tracking) -> list:
        """``trainer.val_only`` (verl): one validation of the policy as loaded, no training."""
        val = self._validate()
        if not val:
            raise ConfigError("trainer.val_only=true, but this run has nothing to validate: it "
                              "needs a validation set (data.val_files, or the built-in task) "
                              "and a workflow with a rollout and a reward")
        tracking.log(self.worker.global_step, val)
        return [{"step": self.worker.global_step, **val}]

    def fit(self) -> list:
        configure_threads(self.config)
        seed_everything(self.config.trainer.seed)
        root = self.config.trainer.default_local_dir
        comm = self.worker.comm
        with QuietLibraries(root, comm.rank, comm.world_size) as quiet:
            try:
                return self._fit(quiet)
            finally:
                if comm.is_chief:
                    quiet.announce()

    def _steps_per_epoch(self) -> Optional[int]:
        loader = self.worker.train_loader
        return len(loader) if loader is not None else None

    def _begin(self, quiet: QuietLibraries) -> Begun:
        """Set-up before the first step: engines and data, the step budget, the resume,
        the trackers (``metrics.jsonl`` keeps the records up to the resumed step)."""
        set_up = time.perf_counter()
        self.worker.setup()
        quiet.watch_loggers()  # the handlers of libraries the engines loaded
        budget = StepBudget.of(self.config, self._steps_per_epoch())
        steps = budget.steps
        self.worker.set_total_training_steps(steps)
        resumed = self._maybe_resume()
        comm = self.worker.comm
        if comm.is_chief:  # a run asked for more steps than it will train
            at_step = self.worker.global_step
            notice = budget.finished_notice(at_step) if resumed and at_step >= steps \
                else budget.capped_notice()
            if notice:
                print(notice, flush=True)
        startup_metrics = {"timing_s/setup": time.perf_counter() - set_up}
        startup.settle()  # everything loaded: later collections skip it
        keep = self.worker.global_step if resumed else -1
        tracking = build_tracking(self.config, keep_through=keep,
                                  custom_metrics=self.worker.metrics.custom_names) \
            if comm.is_chief else Tracking([])
        health = StepHealth(self.config, self._reward_engine, chief=comm.is_chief)
        return Begun(steps, resumed, keep, startup_metrics, tracking, health)

    def _fit(self, quiet: QuietLibraries) -> list:
        begun = self._begin(quiet)
        steps, resumed, tracking, health = begun.steps, begun.resumed, begun.tracking, \
            begun.health
        startup_metrics = begun.startup_metrics
        comm = self.worker.comm
        history = []
        progress = None
        try:
            if self.config.trainer.val_only:
                return self._validate_only(tracking)
            if not resumed and self.config.trainer.val_before_train:
                val = self._validate()
                if val:
                    tracking.log(self.worker.global_step, val)
                    history.append({"step": self.worker.global_step, **val})
            # a bar on a terminal only: redirected output gets whole lines, no \r
            progress = Progress(steps, self.worker.global_step, enabled=comm.is_chief)
            batches = self._batches()
            loop_start = time.perf_counter()
            while self.worker.global_step < steps:
                self.worker.global_step += 1
                step = self.worker.global_step
                start = time.perf_counter()
                with self.worker.profiler.step(step):
                    result = self.worker.execute_task_graph(next(batches),
                                                            next_batch=lambda: next(batches))
                metrics = dict(result.metrics)
                last_batch = next(iter(result.outputs.values())).batch if result.outputs \
                    else None
                metrics.update(_throughput(last_batch, time.perf_counter() - start))
                # wall clock since the loop started: steps per second, curves against time
                metrics["timing_s/wall"] = time.perf_counter() - loop_start
                if startup_metrics:  # this process's first step
                    startup_metrics["timing_s/to_first_step"] = time.time() - self.started_at
                    metrics.update(startup_metrics)
                    startup_metrics = {}
                metrics = comm.reduce_metrics(metrics)
                self._dump_generations(step, result.outputs)
                health.count_skipped(step, metrics)
                last = step == steps
                val = self._validate() if is_due(step, self.config.trainer.test_freq,
                                                last) else {}
                progress.update()
                tracking.log(step, metrics)
                history.append({"step": step, **metrics})
                if val:
                    tracking.log(step, val)
                    history.append({"step": step, **val})
                health.check_rewards(metrics)  # stops a run whose rewards all fail
                if is_due(step, self.config.trainer.save_freq, last):
                    self.checkpoints.save(step, self._stateful_engines(),
                                          self._trainer_state(), comm, final=last)
                if comm.is_chief:  # start-up and first-step warnings are in by now
                    quiet.announce()
            health.summary()
        finally:
            if progress is not None:
                progress.close()  # clear the bar so an error message stands alone
            tracking.close()
        return history
