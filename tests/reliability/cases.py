"""The reliability corpus: what a new user or an unlucky operator does to the main job, and
what siiRL must do about it (issue 16, item 10).

Each ``Case`` is one real ``python -m siirl.main_dag`` run (``test_corpus.py`` runs them):
the main job at CI size (``BASE``) plus the case's overrides, in a fresh folder that holds
the files the case writes. Every case asserts the exit status, that the tail of stderr
names the cause (``message``: regexes that must all match), that no traceback is printed
and that committed checkpoints and metrics are intact (``checks``).

``tools/reliability_table.py`` renders the "What happens when..." table of docs/reliability.md
from this list, so a case's ``did`` and ``says`` are written for a reader of that page.

The cases are written by class in ``corpus_<class>.py``; ``corpus_model.py`` holds
what a case is.
"""

from corpus_checkpoint import CHECKPOINT
from corpus_config import CONFIG
from corpus_data import DATA
from corpus_disk import DISK
from corpus_model import BASE, CLASSES, Case, Fault
from corpus_reward import REWARD
from corpus_signals import SIGNAL, WORKER

__all__ = ["BASE", "CASES", "CLASSES", "Case", "Fault"]

CASES = [*CONFIG, *DATA, *REWARD, *CHECKPOINT, *DISK, *SIGNAL, *WORKER]


def _check_corpus() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    assert all(c.kind in CLASSES for c in CASES)


_check_corpus()
