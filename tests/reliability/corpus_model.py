"""The reliability corpus's vocabulary: what one case is (``Case``, ``Fault``), the main
job at CI size every case starts from (``BASE``), the classes of the table, the names
of the extra checks, and the regex helpers the sections write their messages with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple, Union

CLASSES = {
    "config": "bad config",
    "data": "bad data",
    "reward": "bad reward code",
    "checkpoint": "bad checkpoints",
    "disk": "disk faults",
    "signal": "signals",
    "worker": "worker faults",
}

# The main job at CI size; ``{run}`` is the run folder, ``{tmp}`` the case's folder.
BASE = ("trainer.default_local_dir={run}", "data.train_batch_size=16",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "trainer.logger=[]", "trainer.val_before_train=false", "trainer.device=cpu",
        "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=-1")
# Long enough to be interrupted; a checkpoint every 2 steps.
LONG = ("trainer.total_training_steps=500", "trainer.save_freq=2")
TWO_WORKERS = ("trainer.n_gpus_per_node=2", "trainer.ray_address=local",
               "trainer.ray_temp_dir={ray}")

FileContent = Union[str, bytes, Callable[[Path], None]]

# Names of the extra checks (test_corpus.py implements them):
#   steps_once        metrics.jsonl has training steps 1..N, each once (N: total steps)
#   no_duplicates     no training step is logged twice, and the last step N is there
#   reward_errors     some step counted reward/errors > 0, with a reward/errors/<kind> > 0
#   counted           reward/errors or train/skipped_steps is > 0 somewhere (not silent)
#   committed_intact  checkpoints committed before the run (and not damaged by the case)
#                     are still there, byte for byte; every global_step_* has COMMITTED
#   new_checkpoint    the run committed a checkpoint of its last step N
#   no_code_ran       a checkpoint's pickled payload did not run (no {tmp}/PWNED)
#   no_duplicates_so_far  no training step is logged twice (a run that stopped early)
# and, for every case: no ``.global_step_*.partial`` folder is left behind.


@dataclass(frozen=True)
class Fault:
    """Something done to the running job: ``action`` once ``after_steps`` training steps
    are in metrics.jsonl (or ``after_s`` seconds after the start, when set)."""

    action: str  # sigterm | sigint | sigint_twice | sigkill | stop_worker | kill_worker
    after_steps: int = 3
    after_s: Optional[float] = None


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # a key of CLASSES
    did: str  # what the user did, one line (docs/reliability.md)
    says: str  # what siiRL does, in words (the page too): the cause it names, or how it contains
    exit: Union[int, Tuple[int, ...]]  # expected exit status (a tuple: any of these)
    message: Tuple[str, ...] = ()  # regexes (case-insensitive) the end of stderr must match
    argv: Tuple[str, ...] = ()  # overrides after BASE (a later key wins)
    files: Dict[str, FileContent] = field(default_factory=dict)  # written under {tmp}
    checks: Tuple[str, ...] = ()
    fast: bool = False  # rejected before anything loads: runs in CI
    seed: bool = False  # start from a run folder with committed checkpoints of steps 1, 2
    damage: Optional[Callable[[Path], None]] = None  # applied to the run folder first
    damaged: Tuple[str, ...] = ()  # checkpoints the damage touched (not checked intact)
    fault: Optional[Fault] = None
    then: Optional[Tuple[str, ...]] = None  # overrides of a second run that must exit 0
    workers: int = 1
    unprivileged: bool = False  # run without root's override of file permissions
    file_size_limit: Optional[int] = None  # RLIMIT_FSIZE of the run, bytes
    timeout_s: float = 240.0
    whole_stderr: bool = False  # match ``message`` anywhere in stderr (warnings of a run
    # that finished), not only in its last lines

    def argv_for(self, tmp: Path, run: Path, ray: str = "") -> list:
        extra = TWO_WORKERS if self.workers == 2 else ()
        return [a.format(tmp=tmp, run=run, ray=ray) for a in (*BASE, *extra, *self.argv)]

    def total_steps(self, argv: list) -> int:
        return int([a for a in argv if a.startswith("trainer.total_training_steps=")][-1]
                   .split("=", 1)[1])


def esc(text: str) -> str:
    return re.escape(str(text))


def key_value(key: str, value) -> str:
    """The key and its value on one line, in either order (the value as a whole token)."""
    k, v = esc(key), rf"(?<![\w.-]){esc(value)}(?![\w.])"
    return rf"{k}[^\n]*{v}|{v}[^\n]*{k}"
