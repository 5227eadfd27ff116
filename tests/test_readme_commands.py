"""The README and the reference pages in docs/ are a promise: the paths, extras and tools
their commands name exist, and their cheap commands run as written (the custom-pipeline
example has its own test, links their own: tests/test_doc_links.py)."""

import re
import subprocess
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TEXT = "\n".join(page.read_text() for page in PAGES)


def bash_blocks() -> list:
    return re.findall(r"```bash\n(.*?)```", TEXT, re.S)


def test_the_readme_is_a_front_door_that_links_every_page():
    """At most 400 lines (issue 31): the reference lives in docs/, and each page is linked
    from the README or from a page it links."""
    readme = PAGES[0].read_text()
    assert len(readme.splitlines()) <= 400
    reached, todo = set(), [PAGES[0]]
    while todo:
        page = todo.pop()
        for target in re.findall(r"\]\(([^)#:\s]+\.md)(?:#[^)]*)?\)", page.read_text()):
            linked = (page.parent / target).resolve()
            if linked not in reached and linked.exists():
                reached.add(linked)
                todo.append(linked)
    assert [p.name for p in PAGES[1:] if p.resolve() not in reached] == []


def test_named_files_exist():
    named = re.findall(r"(?<![\w/.])((?:tools|configs|docs|packages|tests)/[\w./-]+\.\w+)", TEXT)
    missing = [p for p in set(named) if not (ROOT / p).exists()]
    assert not missing, missing


def _module_path(parts: list):
    """The file or package folder of the module named by ``parts``, in any distribution."""
    for src in sorted((ROOT / "packages").glob("*/src")):
        base = src.joinpath(*parts)
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py")
        if base.is_dir():
            return base
    return None


def _unresolved(name: str):
    """Why ``siirl.a.b.C`` names nothing, or None: its longest module prefix must exist and
    the next name must be a submodule, or be defined, imported or exported in that module."""
    parts = name.split(".")
    for n in range(len(parts), 1, -1):
        found = _module_path(parts[:n])
        if found is None:
            continue
        if n == len(parts):
            return None
        attr = parts[n]
        source = found / "__init__.py" if found.is_dir() else found
        # defined, imported, or exported by name (__all__, a lazy-import table)
        defined = (rf"^\s*(class|def|async def)\s+{attr}\b|^{attr}\s*[:=]|import .*\b{attr}\b"
                   rf"|[\"']{attr}[\"']")
        if source.is_file() and re.search(defined, source.read_text(), re.M):
            return None
        return f"{name}: {attr} is not in {found.relative_to(ROOT)}"
    return f"{name}: no such module"


def test_named_modules_and_source_files_exist():
    plugin_groups = set(re.findall(r'"(siirl\.\w+)":', (
        ROOT / "packages/siirl-core/src/siirl/plugins.py").read_text()))
    dotted = set(re.findall(r"(?<![\w/.])siirl(?:\.\w+)+", TEXT)) - plugin_groups
    problems = [_unresolved(name) for name in sorted(dotted) if "mutmut" not in name]
    files = set(re.findall(r"(?<![\w/.])(siirl/[\w/]+\.py)", TEXT)) - {"siirl/__init__.py"}
    problems += [f"{path}: no such file" for path in sorted(files)
                 if not list((ROOT / "packages").glob(f"*/src/{path}"))]
    assert not [p for p in problems if p], [p for p in problems if p]


def test_extras_named_exist():
    declared = {}
    for project in (ROOT / "packages").glob("*/pyproject.toml"):
        meta = tomllib.loads(project.read_text())["project"]
        declared[meta["name"]] = set(meta.get("optional-dependencies", {}))
    for dist, extra in set(re.findall(r"(siirl-\w+)\[([\w-]+)\]", TEXT)):
        assert extra in declared[dist], f"{dist}[{extra}]"


def test_venv_tools_named_are_installed_by_the_setup():
    setup = (ROOT / "tools/setup.sh").read_text() + (ROOT / "requirements-dev.txt").read_text()
    scripts = {name for project in (ROOT / "packages").glob("*/pyproject.toml")
               for name in tomllib.loads(project.read_text())["project"].get("scripts", {})}
    for tool in set(re.findall(r"\.venv/bin/([\w-]+)", TEXT)) - {"python"}:
        assert tool in setup or tool in scripts, tool


def test_torch_is_pinned_as_the_setup_pins_it():
    pin = re.search(r'torch==\$\{SIIRL_TORCH_VERSION:-([\d.]+)\}',
                    (ROOT / "tools/setup.sh").read_text()).group(1)
    installs = [line for block in bash_blocks() for line in block.splitlines()
                if re.search(r"pip install .*torch", line)]
    assert installs and all(f"torch=={pin}" in line for line in installs), installs


def test_the_wheel_build_command_runs_as_written(tmp_path):
    block = next(b for b in bash_blocks() if "-m build" in b)
    script = block.replace("siirl-data siirl-core siirl-engine siirl-envs", "siirl-data")
    script = script.replace("--outdir dist", f"--outdir {tmp_path}")
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(tmp_path.glob("siirl_data-*.whl"))
