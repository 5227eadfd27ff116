"""The "What happens when..." table of docs/reliability.md, rendered from the reliability corpus
(tests/reliability/cases.py), so the table says exactly what the tests assert.

    .venv/bin/python tools/reliability_table.py            # print it
    .venv/bin/python tools/reliability_table.py --write    # replace it in docs/reliability.md
    .venv/bin/python tools/reliability_table.py --check    # exit 1 if docs/reliability.md differs
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reliability.md"
CASES_FILE = ROOT / "tests" / "reliability" / "cases.py"
BEGIN = "<!-- reliability-table: begin (tools/reliability_table.py --write) -->"
END = "<!-- reliability-table: end -->"


def load_cases():
    # cases.py gathers the corpus_*.py modules beside it, as test_corpus.py imports it
    if str(CASES_FILE.parent) not in sys.path:
        sys.path.insert(0, str(CASES_FILE.parent))
    spec = importlib.util.spec_from_file_location("reliability_cases", CASES_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while it runs
    spec.loader.exec_module(module)
    return module


def outcome(case) -> str:
    codes = case.exit if isinstance(case.exit, tuple) else (case.exit,)
    if codes == (0,):
        return case.says[:1].upper() + case.says[1:]
    if codes == (-9,):
        return case.says[:1].upper() + case.says[1:]
    shown = " or ".join(str(c) for c in codes)
    return f"exit {shown}: {case.says}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    corpus = load_cases()
    counts = Counter(case.kind for case in corpus.CASES)
    summary = ", ".join(f"{label} {counts[kind]}" for kind, label in corpus.CLASSES.items())
    lines = [BEGIN,
             f"{len(corpus.CASES)} cases ({summary}); each is a test in "
             "`tests/reliability/` that runs the real command and asserts the exit status, "
             "the cause named at the end of stderr, no traceback, no `.partial` folder left "
             "and, where it applies, committed checkpoints unchanged and each step in "
             "`metrics.jsonl` once.",
             "",
             "| class | what you did | what siiRL does |",
             "|---|---|---|"]
    for kind, label in corpus.CLASSES.items():
        for case in corpus.CASES:
            if case.kind == kind:
                lines.append(f"| {label} | {_cell(case.did)} | {_cell(outcome(case))} |")
    lines.append(END)
    return "\n".join(lines)


def replace_in(text: str, block: str) -> str:
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        raise SystemExit(f"{PAGE}: the reliability-table markers are missing")
    return text[:start] + block + text[stop + len(END):]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true",
                      help="replace the table in docs/reliability.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if docs/reliability.md is stale")
    args = parser.parse_args(argv)
    block = render()
    if not (args.write or args.check):
        print(block)
        return 0
    text = PAGE.read_text()
    updated = replace_in(text, block)
    if args.check:
        if updated != text:
            print("docs/reliability.md's reliability table is stale: run "
                  "tools/reliability_table.py --write", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
