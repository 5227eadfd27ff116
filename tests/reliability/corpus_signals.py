"""The reliability corpus's signals and worker faults (``cases.py`` lists every
case)."""

from __future__ import annotations

from corpus_model import LONG, Case, Fault

# ---------------------------------------------------------------------------------------
# signals and worker faults
# ---------------------------------------------------------------------------------------

TERMINATED = (r"^siirl-train: terminated",)
INTERRUPTED = (r"^siirl-train: interrupted",)
KEEPS = ("committed_intact",)
PARALLEL = ("reward_model.reward_manager=parallel",)

SIGNAL = [
    Case("signal_sigterm", "signal", "SIGTERM (e.g. a scheduler) during training",
         "one line; the last committed checkpoint is kept", 143,
         message=TERMINATED, argv=LONG, fault=Fault("sigterm"), checks=KEEPS),
    Case("signal_ctrl_c", "signal", "Ctrl-C during training",
         "one line; the last committed checkpoint is kept", 130,
         message=INTERRUPTED, argv=LONG, fault=Fault("sigint"), checks=KEEPS),
    Case("signal_ctrl_c_twice", "signal", "Ctrl-C twice, impatiently",
         "one line; the last committed checkpoint is kept", 130,
         message=INTERRUPTED, argv=LONG, fault=Fault("sigint_twice"), checks=KEEPS),
    Case("signal_ctrl_c_parallel", "signal",
         "Ctrl-C during training with the `parallel` reward manager",
         "one line, none from the pool processes", 130, message=INTERRUPTED,
         argv=(*LONG, *PARALLEL), fault=Fault("sigint"), checks=KEEPS),
    Case("signal_sigterm_parallel", "signal", "SIGTERM with the `parallel` reward manager",
         "one line, none from the pool processes", 143, message=TERMINATED,
         argv=(*LONG, *PARALLEL), fault=Fault("sigterm"), checks=KEEPS),
    Case("signal_sigterm_at_start", "signal", "SIGTERM 1.5 s after the start, before step 1",
         "one line", 143, message=TERMINATED, argv=LONG,
         fault=Fault("sigterm", after_s=1.5)),
    Case("signal_sigterm_while_saving", "signal",
         "SIGTERM while a checkpoint is saved at every step",
         "one line; the in-flight checkpoint is committed or discarded, "
         "never half-written", 143, message=TERMINATED,
         argv=("trainer.total_training_steps=500", "trainer.save_freq=1"),
         fault=Fault("sigterm", after_steps=4), checks=KEEPS),
    Case("signal_kill_9_then_resume", "signal", "`kill -9` of the run, then the same command",
         "the next run resumes from the last committed checkpoint; each step logged once", -9,
         argv=LONG, fault=Fault("sigkill"), then=("trainer.total_training_steps=12",),
         checks=("committed_intact", "steps_once"), timeout_s=300),
]

WORKER_ARGS = (*LONG, "trainer.test_freq=-1")
WORKER = [
    Case("worker_stopped", "worker", "a worker of a 2-worker run is stopped (SIGSTOP)",
         "names the worker's rank, pid and host, and the heartbeat timeout", 1,
         message=(r"worker rank 1 \(pid \d+ on", r"stopped responding",
                  r"heartbeat_timeout_s=6"),
         argv=(*WORKER_ARGS, "trainer.heartbeat_timeout_s=6"), workers=2,
         fault=Fault("stop_worker"), checks=KEEPS, timeout_s=300),
    Case("worker_killed_then_resume", "worker",
         "a worker of a 2-worker run is killed (SIGKILL), then the same command",
         "names the worker's rank and pid; the next run resumes, each step once", 1,
         message=(r"rank 1", r"pid \d+"), argv=WORKER_ARGS, workers=2,
         fault=Fault("kill_worker"), then=("trainer.total_training_steps=12",),
         checks=("committed_intact", "steps_once"), timeout_s=300),
    Case("worker_sigterm", "worker", "SIGTERM to a 2-worker run",
         "one line; every worker stops within seconds", 143, message=TERMINATED,
         argv=WORKER_ARGS, workers=2, fault=Fault("sigterm"), checks=KEEPS, timeout_s=300),
    Case("worker_ctrl_c", "worker", "Ctrl-C in a 2-worker run",
         "one line; every worker stops within seconds", 130,
         message=INTERRUPTED, argv=WORKER_ARGS, workers=2, fault=Fault("sigint"),
         checks=KEEPS, timeout_s=300),
]
