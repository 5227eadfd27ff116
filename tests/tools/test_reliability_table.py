"""docs/reliability.md's "What happens when..." table is exactly what
tools/reliability_table.py renders from the reliability corpus (tests/reliability/cases.py)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("reliability_table",
                                                  ROOT / "tools/reliability_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_table_matches_the_corpus():
    assert load().main(["--check"]) == 0


def test_every_case_is_a_row():
    table = load()
    block = table.render()
    cases = table.load_cases().CASES
    rows = [line for line in block.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == len(cases) + 1  # and the header


def test_replace_keeps_the_rest_of_the_text():
    table = load()
    text = f"before\n{table.BEGIN}\nold\n{table.END}\nafter\n"
    assert table.replace_in(text, f"{table.BEGIN}\nnew\n{table.END}") == \
        f"before\n{table.BEGIN}\nnew\n{table.END}\nafter\n"
