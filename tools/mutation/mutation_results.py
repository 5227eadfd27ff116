"""What the last mutmut run of a group found, read from its meta files
(``tools/mutation/run.py --results``)."""

from __future__ import annotations

import json
from pathlib import Path

from mutation_groups import GROUPS, WORK


def counts(name: str) -> dict:
    """Status -> number of mutants, from the mutmut meta files of the group's last run."""
    from collections import Counter

    statuses = Counter()
    for status in statuses_by_mutant(name).values():
        statuses[status] += 1
    return dict(statuses)


def _mutated_now(name: str, meta: Path) -> bool:
    """Whether the group (as configured now) mutates the file of ``meta``: a file dropped
    from a group keeps its old results in the working folder."""
    from fnmatch import fnmatch

    group = GROUPS[name]
    rel = meta.relative_to(WORK / name / "mutants").as_posix()[:-len(".meta")]
    return any(fnmatch(rel, f"src/{g}") for g in group.mutate) and \
        not any(fnmatch(rel, f"src/{g}") for g in group.skip)


def statuses_by_mutant(name: str) -> dict:
    from mutmut.stats import status_by_exit_code

    result = {}
    for meta in sorted((WORK / name / "mutants").rglob("*.py.meta")):
        if not _mutated_now(name, meta):
            continue
        data = json.loads(meta.read_text())
        for key, code in data.get("exit_code_by_key", {}).items():
            result[key] = status_by_exit_code[code]
    return result


def not_killed(name: str) -> dict:
    return {key: status for key, status in statuses_by_mutant(name).items()
            if status != "killed"}


def print_summary(names) -> None:
    header = ("group", "mutants", "killed", "survived", "no tests", "timeout", "other")
    print("  ".join(f"{h:>10}" for h in header))
    for name in names:
        c = counts(name)
        total = sum(c.values())
        shown = [c.get(k, 0) for k in ("killed", "survived", "no tests", "timeout")]
        print("  ".join(f"{v:>10}" for v in (name, total, *shown, total - sum(shown))))
