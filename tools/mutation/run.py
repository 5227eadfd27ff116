"""Mutation testing of siiRL's core modules with mutmut 3 (``nox -s mutmut``).

The groups are in ``mutation_groups.py``, the copy's transformations in
``mutation_source.py``, the working folders in ``mutation_workdir.py`` and the
results in ``mutation_results.py``.

Usage (from the repository root, in the dev venv with mutmut installed)::

    python tools/mutation/run.py                      # every group
    python tools/mutation/run.py checkpoint           # one group (or several)
    python tools/mutation/run.py --list               # groups, modules and tests
    python tools/mutation/run.py --results            # surviving mutants of every group
    python tools/mutation/run.py --show checkpoint <mutant name>   # the mutant's diff

Never run ``mutmut apply`` in a working folder: it would write the mutant into the copy,
which the next run refreshes from packages/ anyway, but it is never what you want.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from mutation_groups import GROUPS, ROOT
from mutation_results import not_killed, print_summary
from mutation_workdir import prepare, run_mutmut


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("groups", nargs="*", help=f"some of {', '.join(GROUPS)} (all)")
    parser.add_argument("--list", action="store_true", help="the groups and their tests")
    parser.add_argument("--results", action="store_true",
                        help="print the groups' mutants that were not killed; do not run")
    parser.add_argument("--show", nargs=2, metavar=("GROUP", "MUTANT"),
                        help="print one mutant's diff")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--prepare-only", action="store_true",
                        help="write the working folders; do not run mutmut")
    args = parser.parse_args(argv)

    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}; the groups: {', '.join(GROUPS)}")
    names = args.groups or list(GROUPS)

    if args.list:
        for name in names:
            group = GROUPS[name]
            print(f"{name}:\n  mutates {', '.join(group.src + '/' + m for m in group.mutate)}")
            for skip in group.skip:
                print(f"  except  {group.src}/{skip}")
            if group.why_skipped:
                print(f"          ({group.why_skipped})")
            print("  tests   " + "\n          ".join(group.tests))
        return 0
    if args.show:
        name, mutant = args.show
        return run_mutmut(prepare(name, GROUPS[name]), "show", mutant).returncode
    if args.results:
        for name in names:
            for key, status in sorted(not_killed(name).items()):
                print(f"{name}: {key}: {status}")
        print_summary(names)
        return 0

    failed = []
    for name in names:
        work = prepare(name, GROUPS[name])
        if args.prepare_only:
            print(f"{name}: {work}")
            continue
        print(f"==== mutmut: {name} ({work.relative_to(ROOT)})", flush=True)
        start = time.monotonic()
        code = run_mutmut(work, "run", "--max-children", str(args.max_children)).returncode
        print(f"==== {name}: mutmut exited {code} after {time.monotonic() - start:.0f} s",
              flush=True)
        if code != 0:
            failed.append(name)
    if args.prepare_only:
        return 0
    print("\nMutants not killed (`python tools/mutation/run.py --show GROUP NAME` for a diff; "
          "docs/mutation.md lists the equivalent ones):")
    for name in names:
        for key, status in sorted(not_killed(name).items()):
            print(f"  {name}: {key}: {status}")
    print()
    print_summary(names)
    if failed:
        print(f"mutmut failed for: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
