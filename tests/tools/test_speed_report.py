"""docs/speed.md's speed section is exactly what tools/bench/speed_report.py renders from the
committed benchmark results in docs/bench/ (so no number in it goes stale by hand)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("speed_report",
                                                  ROOT / "tools/bench/speed_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_section_matches_the_committed_results():
    assert load().main(["--check"]) == 0


def test_every_result_file_is_rendered_and_names_its_command():
    report = load()
    block = report.render()
    for path in sorted((ROOT / "docs/bench").glob("*.json")):
        command = __import__("json").loads(path.read_text())["run"]["command"]
        assert command in block, f"{path.name} is not in docs/speed.md's speed section"


def test_replace_keeps_the_rest_of_the_text():
    report = load()
    text = f"before\n{report.BEGIN}\nold\n{report.END}\nafter\n"
    assert report.replace_in(text, f"{report.BEGIN}\nnew\n{report.END}") == \
        f"before\n{report.BEGIN}\nnew\n{report.END}\nafter\n"
