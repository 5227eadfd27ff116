"""``python -m mutmut`` with one change, for code that runs in child processes.

mutmut maps each function to the tests that call it by recording calls in the test
process. The DataBuffer runs in the ranks ``torch.multiprocessing`` spawns, the reward
managers' scoring partly in worker processes: calls there are never recorded, so mutmut
would report their mutants as "no tests" without running anything. Here, a function no
test was seen calling is tested with every test of the group instead (slower, but the
mutant is actually run); results cached as "no tests" are retried.

And every run retests the mutants that were not killed last time (mutmut keeps every
cached result until the mutated function changes), so a test added since counts.

Run by tools/mutation/run.py in a group's working folder; arguments as for ``mutmut``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mutmut.__main__ as mm
from mutmut.mutation.data import SourceFileMutationData
from mutmut.state import state

KILLED = {1, 3}  # mutmut's exit codes of a killed mutant (a failing test, a pytest error)


def _map_unseen_functions_to_every_test() -> None:
    everything = set(state().duration_by_test)
    if not everything:
        return
    tests = state().tests_by_mangled_function_name
    for name in state().current_function_hashes:
        if not tests.get(name):
            tests[name] = set(everything)
    for path in mm.walk_mutatable_files():
        data = SourceFileMutationData(path=Path(path))
        data.load()
        stale = [k for k, code in data.exit_code_by_key.items()
                 if code is not None and code not in KILLED]
        if stale:
            for key in stale:
                data.exit_code_by_key[key] = None
            data.save()


_collect = mm.collect_or_load_stats


def collect_or_load_stats(*args, **kwargs):
    result = _collect(*args, **kwargs)
    _map_unseen_functions_to_every_test()  # and reset what was not killed
    return result


mm.collect_or_load_stats = collect_or_load_stats

if __name__ == "__main__":
    sys.argv[0] = "mutmut"
    mm.cli()
