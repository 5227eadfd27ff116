"""Mutation testing of siiRL's core modules with mutmut 3 (``nox -s mutmut``).

mutmut 3 expects one ``src/`` tree, one ``[tool.mutmut]`` config and one ``tests/`` folder
per project; siiRL is four distributions sharing the namespace ``siirl``. So each module
group gets its own working folder, ``build/mutmut/<group>/``, holding:

- ``src/siirl/<package>/``: a copy of the Python package the group's modules live in (a
  regular package must be complete where it is found first on ``sys.path``; only the
  group's modules are mutated, the rest is copied unchanged);
- ``tests/``: a copy of the repository's tests (only the group's test files run);
- ``pyproject.toml``: the repository's pytest settings and the group's ``[tool.mutmut]``.

mutmut runs there and writes ``build/mutmut/<group>/mutants/``; ``PYTHONPATH`` points at
the mutated tree too, so worker processes the tests start import the mutated code, and
``mutmut_main.py`` tests a function only child processes call (the DataBuffer's ranks)
with every test of its group instead of reporting it as "no tests".

The string literals of exception, warning and log messages are not mutated (see
``message_lines``): their wording is for people, and tests check what a message names.

mutmut 3 never mutates a decorated function (other than ``@staticmethod`` /
``@classmethod``). The registries of ``core_algos`` (``@register_adv_est("grpo")`` ...)
would hide every estimator and loss, so the copy spells those module-level decorators
as an assignment after the function, ``f = register_adv_est("grpo")(f)``, which Python
defines to be the same thing; methods keep their decorators.

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
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "build" / "mutmut"


@dataclass(frozen=True)
class Group:
    """One mutation run: ``package`` (a folder under ``src``) is copied, the files matching
    ``mutate`` (globs relative to ``src``) are mutated, ``tests`` are run against them."""

    src: str
    package: str
    mutate: tuple[str, ...]
    tests: tuple[str, ...]
    deselect: tuple[str, ...] = ()  # tests that break when run out of order (see GROUPS)
    skip: tuple[str, ...] = ()  # globs (relative to src) of modules not to mutate
    why_skipped: str = ""
    options: dict = field(default_factory=dict)  # extra [tool.mutmut] keys


CORE = "packages/siirl-core/src"
DATA = "packages/siirl-data/src"
ENGINE = "packages/siirl-engine/src"

GROUPS: dict[str, Group] = {
    "core_algos": Group(
        src=CORE,
        package="siirl/dag_worker",
        mutate=("siirl/dag_worker/core_algos/*",),
        tests=("tests/core/dag_worker/core_algos/test_core_algos_advantages.py",
               "tests/core/dag_worker/core_algos/test_core_algos_kl.py",
               "tests/core/dag_worker/core_algos/test_core_algos_losses.py",
               "tests/core/dag_worker/core_algos/test_core_algos_policy_losses.py",
               "tests/core/dag_worker/core_algos/test_core_algos_mutants.py",
               "tests/core/dag_worker/multi_agent/test_agent_groups.py"),  # MARFT's GAE (gae_marft)
    ),
    "data_buffer": Group(
        src=DATA,
        package="siirl/data_coordinator",
        mutate=("siirl/data_coordinator/data_buffer.py",),
        # test_two_ranks / test_four_ranks spawn their ranks (seconds of imports each):
        # test_data_buffer_mutants.py runs the same scenarios and checks with forked ranks
        tests=("tests/data/test_data_buffer.py::test_layout_and_plan",
               "tests/data/test_data_buffer_mutants.py"),
    ),
    "dataloader": Group(
        src=DATA,
        package="siirl/data_coordinator",
        mutate=("siirl/data_coordinator/dataloader/*",),
        tests=("tests/data/test_partitioned_dataset.py",
               "tests/data/test_stateful_loader.py",
               "tests/data/test_dataloader_mutants.py"),
    ),
    "checkpoint": Group(
        src=CORE,
        package="siirl/dag_worker",
        mutate=("siirl/dag_worker/checkpoint/*",),
        tests=("tests/core/dag_worker/checkpoint/test_checkpoint_manager.py",
               "tests/core/dag_worker/checkpoint/test_checkpoint_state.py",
               "tests/core/dag_worker/checkpoint/test_checkpoint_manager_mutants.py"),
    ),
    "reward": Group(
        src=ENGINE,
        package="siirl/engine",
        mutate=("siirl/engine/reward_manager/*",),
        skip=("siirl/engine/reward_manager/_pool.py",
              "siirl/engine/reward_manager/_process.py",
              "siirl/engine/reward_manager/worker_main.py"),
        why_skipped="the worker processes (starting, feeding, timing out, killing them): "
                    "only the containment tests reach them, each a few seconds of real "
                    "processes (tests/engine/reward_manager, ~30 s), too slow to run per "
                    "mutant; they are checked end to end by that suite",
        # not test_parallel_reward_manager.py: the parallel manager is its worker pool
        # (_pool.py, skipped above); seconds of worker processes per mutant
        tests=("tests/engine/reward/test_reward_managers.py",
               "tests/engine/reward/test_embodied_reward.py",
               "tests/engine/reward/test_reward_plugin_wiring.py",
               "tests/engine/reward/test_reward_function_calls.py",
               "tests/engine/reward/test_reward_results.py",
               "tests/engine/reward/test_reward_manager_lookup.py",
               "tests/engine/reward/test_reward_manager_base.py",
               "tests/engine/reward/test_reward_masks_and_embodied.py"),
    ),
}

# A mutant gets (its tests' clean CPU time + 5 s) x 10 x 2 CPU seconds before it counts as
# a timeout (mutmut's defaults are x15 and + 1 s: too tight for tests that start processes).
COMMON_OPTIONS = {
    "use_git_change_detection": False,  # the working folder's files are copies
    "timeout_multiplier": 10.0,
    "timeout_constant": 5.0,
}


# ---- the working folder --------------------------------------------------------------


def lift_decorators(source: str) -> str:
    """Module-level ``@d(...) def f`` -> ``def f`` then ``f = d(...)(f)`` (same meaning),
    so mutmut mutates registered functions."""
    import libcst as cst

    module = cst.parse_module(source)
    body = []
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.decorators:
            name = stmt.name.value
            applied = name
            for decorator in reversed(stmt.decorators):
                applied = f"({module.code_for_node(decorator.decorator)})({applied})"
            body.append(stmt.with_changes(decorators=[], leading_lines=[
                *stmt.decorators[0].leading_lines, *stmt.leading_lines]))
            body.append(cst.parse_statement(f"{name} = {applied}\n"))
        else:
            body.append(stmt)
    return module.with_changes(body=body).code


# Calls whose string arguments are only text for a person to read.
MESSAGE_CALLS = {"_say", "_warn", "write_line", "warn", "warning", "info", "debug", "error",
                 "exception", "critical", "print"}
MARK = "  # message text: not mutated"
# mutmut skips every expression (with what it contains) that starts on a line matching
# one of do_not_mutate_patterns; a "# pragma: no mutate" would miss a statement's later lines
MARK_PATTERN = r"# message text: not mutated$"


def _call_name(node) -> str:
    func = node.func
    name = getattr(getattr(func, "attr", None), "value", None) or getattr(func, "value", "")
    return name if isinstance(name, str) else ""


def message_lines(source: str) -> set[int]:
    """Lines of the string-literal arguments of exception constructors (``raise E(...)``)
    and of warning, log and print calls, and of implicit string concatenations spanning
    several lines (a sentence split to fit): text for people. Tests check what a message
    names (the file, the step, the field), not its wording; mutating the wording ("XX" +
    s + "XX", upper, lower, the argument dropped) only makes mutants no test should pin
    down. Line-based (mutmut's do_not_mutate_patterns): a behavioural expression sharing
    such a line is skipped too."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    lines: set[int] = set()
    inside_strings: set[int] = set()  # lines a multi-line string continues past

    class Visitor(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (PositionProvider,)

        def _mark(self, call) -> None:
            for arg in call.args:  # the text itself; other arguments are behaviour
                if not isinstance(arg.value, (cst.SimpleString, cst.ConcatenatedString,
                                              cst.FormattedString)):
                    continue
                where = self.get_metadata(PositionProvider, arg)
                lines.update(range(where.start.line, where.end.line + 1))

        def visit_Raise(self, node) -> None:
            if isinstance(node.exc, cst.Call):
                self._mark(node.exc)

        def visit_Call(self, node) -> None:
            if _call_name(node) in MESSAGE_CALLS:
                self._mark(node)

        def visit_ConcatenatedString(self, node) -> None:
            # "..." "..." over several lines: a sentence split to fit the line length
            where = self.get_metadata(PositionProvider, node)
            if where.end.line > where.start.line:
                lines.update(range(where.start.line, where.end.line + 1))

        def _string(self, node) -> None:
            where = self.get_metadata(PositionProvider, node)
            inside_strings.update(range(where.start.line, where.end.line))

        def visit_SimpleString(self, node) -> None:
            self._string(node)

        def visit_FormattedString(self, node) -> None:
            self._string(node)

    MetadataWrapper(cst.parse_module(source)).visit(Visitor())
    return lines - inside_strings


def mark_messages(source: str) -> str:
    """Append ``MARK`` (see ``MARK_PATTERN``) to the lines ``message_lines`` finds."""
    marked = message_lines(source)
    out = []
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        if number in marked and not line.rstrip().endswith("\\"):
            line = line.rstrip("\n") + MARK + "\n"
        out.append(line)
    return "".join(out)


def _write_if_changed(path: Path, text: str) -> None:
    """Keeps the file (and its mtime, which mutmut compares) when nothing changed."""
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _sync_tree(src: Path, dst: Path, transform=None) -> None:
    """Make ``dst`` a copy of ``src`` (no caches); unchanged files keep their mtime."""
    wanted = set()
    for path in sorted(src.rglob("*")):
        if "__pycache__" in path.parts or path.is_dir() or path.suffix in (".pyc", ".calls",
                                                                            ".done", ".pid"):
            continue
        rel = path.relative_to(src)
        wanted.add(rel)
        target = dst / rel
        if transform is not None and path.suffix == ".py":
            _write_if_changed(target, transform(rel, path.read_text()))
        elif not target.is_file() or target.read_bytes() != path.read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    if dst.is_dir():
        for path in sorted(dst.rglob("*"), reverse=True):
            if path.is_file() and "__pycache__" not in path.parts and \
                    path.relative_to(dst) not in wanted:
                path.unlink()


def _pytest_settings() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r"^\[tool\.pytest\.ini_options\]\n.*?(?=^\[|\Z)", text, re.S | re.M)
    return match.group(0).rstrip() + "\n" if match else ""


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)  # strings, numbers, lists of strings: JSON is valid TOML


def prepare(name: str, group: Group) -> Path:
    work = WORK / name
    mutated = [f"src/{glob}" for glob in group.mutate]

    def transform(rel: Path, text: str) -> str:
        from fnmatch import fnmatch

        path = f"src/{group.package}/{rel.as_posix()}"
        if any(fnmatch(path, glob) for glob in mutated):
            if "@" in text:
                text = lift_decorators(text)
            text = mark_messages(text)
        return text

    _sync_tree(ROOT / group.src / group.package, work / "src" / group.package, transform)
    _sync_tree(ROOT / "tests", work / "tests")
    config = {
        "source_paths": [f"src/{group.package}"],
        "only_mutate": mutated,
        "do_not_mutate": [f"src/{glob}" for glob in group.skip],
        "do_not_mutate_patterns": [MARK_PATTERN],
        # a test file not written yet (the *_mutants.py ones) is left out, not an error
        "pytest_add_cli_args_test_selection": [t for t in group.tests
                                               if (ROOT / t.split("::")[0]).is_file()],
        "pytest_add_cli_args": ["-p", "no:cacheprovider",
                                *(f"--deselect={test}" for test in group.deselect)],
        **COMMON_OPTIONS,
        **group.options,
    }
    lines = [f"# generated by tools/mutation/run.py for the group {name!r}", "",
             _pytest_settings(), "[tool.mutmut]"]
    lines += [f"{key} = {_toml(value)}" for key, value in config.items()]
    _write_if_changed(work / "pyproject.toml", "\n".join(lines) + "\n")
    return work


def _env(work: Path) -> dict:
    # exists before Python starts: a PYTHONPATH folder missing at startup is cached as
    # "nothing here" and the mutated tree would never be imported
    (work / "mutants" / "src").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(work / "mutants" / "src"), env.get("PYTHONPATH", "")) if p)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(var, "1")  # a shared CPU box: one thread per test process
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _mutmut(work: Path, *args: str, capture: bool = False) -> subprocess.CompletedProcess:
    # mutmut, plus: functions only child processes call are tested too (mutmut_main.py)
    command = [sys.executable, str(Path(__file__).resolve().parent / "mutmut_main.py"), *args]
    return subprocess.run(command, cwd=work, env=_env(work), text=True,
                          capture_output=capture, check=False)


# ---- results ---------------------------------------------------------------------------


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
        return _mutmut(prepare(name, GROUPS[name]), "show", mutant).returncode
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
        code = _mutmut(work, "run", "--max-children", str(args.max_children)).returncode
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
