"""The import graph of packages/*/src (and tools/*.py): no cycles, no private imports, layers.

The graph is read with ``ast``, so it sees every import a module can run: top level,
inside functions (lazy imports), under ``if TYPE_CHECKING``, ``from pkg import submodule``
and ``importlib.import_module("literal")``. Cycles and layers count only edges between our
own modules; the private-name rule covers third-party modules too. Run this file directly
to list every finding.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = ("siirl-data", "siirl-core", "siirl-engine", "siirl-envs")

CORE_FORBIDDEN = ("siirl.engine", "siirl.environment")
EXECUTION_FORBIDDEN = ("siirl.dag_worker", "siirl.launch")
# Backend -> the modules that belong to it (a prefix matches itself and its submodules).
ENGINE_BACKENDS = {
    "fsdp": ("siirl.engine.fsdp", "siirl.engine.fsdp_workers"),
    "megatron": ("siirl.engine.megatron", "siirl.engine.megatron_workers"),
    "rollout": ("siirl.engine.rollout",),
}
# The siirl-core modules siirl-engine and siirl-envs may import are the bullets under this
# heading of docs/architecture.md, so the page and the check cannot disagree.
SURFACE_DOC = ROOT / "docs" / "architecture.md"
SURFACE_HEADING = "## Core's public surface for engines"
PLUGIN_DISTS = ("siirl-engine", "siirl-envs")


@dataclass
class Import:
    target: str  # the module imported
    names: Tuple[str, ...]  # for ``from target import a, b``: the names; else ()
    line: int
    ours: bool = True  # False: a third-party module, kept only for the private-name check


@dataclass(repr=False)  # pytest prints the fixture on failure: keep it one word
class Module:
    name: str
    path: Path
    where: str  # the path shown in reports, relative to the checkout
    dist: str  # distribution directory name, or "tools"
    is_package: bool
    imports: List[Import] = field(default_factory=list)

    def __repr__(self) -> str:
        return self.name


def _module_name(src: Path, path: Path) -> Tuple[str, bool]:
    parts = list(path.relative_to(src).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def discover(root: Path = ROOT) -> Dict[str, Module]:
    modules: Dict[str, Module] = {}
    for dist in DISTRIBUTIONS:
        src = root / "packages" / dist / "src"
        for path in sorted(src.rglob("*.py")):
            name, is_package = _module_name(src, path)
            modules[name] = Module(name, path, str(path.relative_to(root)), dist, is_package)
    for path in sorted((root / "tools").glob("*.py")):  # scripts import each other by stem
        modules[path.stem] = Module(path.stem, path, str(path.relative_to(root)), "tools",
                                    False)
    return modules


def _resolve_relative(module: Module, level: int, name: Optional[str]) -> str:
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


def _ours(dotted: str, modules: Dict[str, Module]) -> Optional[str]:
    """The longest prefix of ``dotted`` that is one of our modules."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _imports_of(module: Module, modules: Dict[str, Module]) -> Iterator[Import]:
    tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _ours(alias.name, modules)
                if target:
                    yield Import(target, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = (_resolve_relative(module, node.level, node.module) if node.level
                    else node.module or "")
            plain = []
            for alias in node.names:  # ``from pkg import submodule`` is an edge to it
                if f"{base}.{alias.name}" in modules:
                    yield Import(f"{base}.{alias.name}", (), node.lineno)
                else:
                    plain.append(alias.name)
            target = _ours(base, modules)
            if target and plain:
                yield Import(target, tuple(plain), node.lineno)
            elif plain and not target:
                yield Import(base, tuple(plain), node.lineno, ours=False)
        elif isinstance(node, ast.Call) and _is_import_module(node):
            target = _ours(node.args[0].value, modules)
            if target:
                yield Import(target, (), node.lineno)


def _is_import_module(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return (name == "import_module" and bool(call.args)
            and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str))


def build_graph(root: Path = ROOT) -> Dict[str, Module]:
    modules = discover(root)
    for module in modules.values():
        module.imports = [i for i in _imports_of(module, modules) if i.target != module.name]
    return modules


# ----------------------------------------------------------------------------- checks
def find_cycles(modules: Dict[str, Module]) -> List[List[str]]:
    """One cycle (as a closed path) per strongly connected component with more than one
    module (Tarjan's algorithm, iterative so deep graphs do not hit the recursion limit)."""
    edges = {name: sorted({i.target for i in m.imports if i.ours})
             for name, m in modules.items()}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return [_cycle_in(component, edges) for component in components]


def _cycle_in(component: List[str], edges: Dict[str, List[str]]) -> List[str]:
    """A shortest closed path through the component's first module (breadth-first)."""
    members, start = set(component), component[0]
    parent: Dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in edges[node]:
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child in members and child not in parent:
                    parent[child] = node
                    following.append(child)
        frontier = following
    return component


def private_imports(modules: Dict[str, Module]) -> List[str]:
    """Leading-underscore names one siirl module takes from another. (Third-party
    internals are outside the rule: megatron/cpu_compat adapts megatron's private CUDA-only
    spots on purpose, and says so.)"""
    found = []
    for module in modules.values():
        for imp in module.imports:
            if not imp.ours:
                continue
            for name in imp.names:
                if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                    found.append(f"{_where(module, imp)} imports {name} from {imp.target}")
    return found


def layer_violations(modules: Dict[str, Module], importer_in, target_in, why: str) -> List[str]:
    return [f"{_where(m, imp)} imports {imp.target} ({why})"
            for m in modules.values() if importer_in(m)
            for imp in m.imports if imp.ours and target_in(modules[imp.target])]


def backend_of(name: str) -> Optional[str]:
    for backend, prefixes in ENGINE_BACKENDS.items():
        if any(_within(name, prefix) for prefix in prefixes):
            return backend
    return None


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def engine_surface(doc: Path = SURFACE_DOC) -> List[str]:
    """The modules listed (``- `siirl.x.y` ...``) under SURFACE_HEADING in ``doc``."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    if SURFACE_HEADING not in lines:
        raise AssertionError(f"{doc}: no {SURFACE_HEADING!r} section; it lists the core "
                             "modules the engine and environment packages may import")
    surface = []
    for line in lines[lines.index(SURFACE_HEADING) + 1:]:
        if line.startswith("## "):
            break
        listed = re.match(r"- `(siirl(?:\.\w+)+)`", line)
        if listed:
            surface.append(listed.group(1))
    return surface


def outside_surface(modules: Dict[str, Module], surface: List[str]) -> List[str]:
    return [f"{_where(m, imp)} imports {imp.target} (not in core's public surface for "
            f"engines, {SURFACE_DOC.relative_to(ROOT)})"
            for m in modules.values() if m.dist in PLUGIN_DISTS
            for imp in m.imports
            if imp.ours and modules[imp.target].dist == "siirl-core"
            and imp.target not in surface]


def _where(module: Module, imp: Import) -> str:
    return f"{module.where}:{imp.line} ({module.name})"


def _report(violations: List[str]) -> str:
    return f"{len(violations)} violation(s):\n  " + "\n  ".join(violations)


# ------------------------------------------------------------------------------ tests
@pytest.fixture(scope="module")
def graph() -> Dict[str, Module]:
    return build_graph()


def test_no_import_cycles(graph):
    cycles = find_cycles(graph)
    assert not cycles, _report([" -> ".join(cycle) for cycle in cycles])


def test_no_private_names_imported_from_other_modules(graph):
    found = private_imports(graph)
    assert not found, _report(found)


def test_siirl_data_imports_only_siirl_data(graph):
    found = layer_violations(graph, lambda m: m.dist == "siirl-data",
                             lambda t: t.dist != "siirl-data",
                             "siirl-data is the bottom layer")
    assert not found, _report(found)


def test_core_never_imports_engine_or_environment(graph):
    found = layer_violations(
        graph, lambda m: m.dist == "siirl-core",
        lambda t: any(_within(t.name, p) for p in CORE_FORBIDDEN),
        "siirl-core finds engines and environments through entry points")
    assert not found, _report(found)


def test_execution_never_imports_dag_worker_or_launch(graph):
    found = layer_violations(
        graph, lambda m: _within(m.name, "siirl.execution"),
        lambda t: any(_within(t.name, p) for p in EXECUTION_FORBIDDEN),
        "siirl.execution is the layer below dag_worker and launch")
    assert not found, _report(found)


def test_engine_backends_never_import_each_other(graph):
    found = [f"{_where(m, imp)} imports {imp.target} (backend {backend_of(m.name)} -> "
             f"{backend_of(imp.target)}; shared code belongs in siirl.engine.common)"
             for m in graph.values() if backend_of(m.name)
             for imp in m.imports
             if imp.ours and backend_of(imp.target) not in (None, backend_of(m.name))]
    assert not found, _report(found)


def test_engines_and_environments_import_only_cores_public_surface(graph):
    surface = engine_surface()
    assert surface, f"{SURFACE_DOC}: {SURFACE_HEADING!r} lists no modules"
    not_core = [name for name in surface
                if name not in graph or graph[name].dist != "siirl-core"]
    assert not not_core, f"{SURFACE_DOC} lists modules that are not siirl-core's: {not_core}"
    found = outside_surface(graph, surface)
    assert not found, _report(found)


# ------------------------------------------------------- the reader itself, on a toy tree
def test_an_engine_import_outside_the_listed_surface_is_found(tmp_path):
    for dist, files in {"siirl-core": {"open.py": "", "private.py": ""},
                        "siirl-engine": {"engine.py": "from siirl.core import open, private\n"}
                        }.items():
        src = tmp_path / "packages" / dist / "src" / "siirl" / dist.split("-")[1]
        src.mkdir(parents=True)
        for name, text in {"__init__.py": "", **files}.items():
            (src / name).write_text(text)
    (tmp_path / "tools").mkdir()
    doc = tmp_path / "architecture.md"
    doc.write_text(f"{SURFACE_HEADING}\n\n- `siirl.core.open`: listed\n\n## Next\n"
                   "- `siirl.core.private`: another section\n")
    assert engine_surface(doc) == ["siirl.core.open"]
    found = outside_surface(build_graph(tmp_path), engine_surface(doc))
    assert [v.split(" (not in")[0].split(") ")[1] for v in found] == \
        ["imports siirl.core.private"]


def test_reader_sees_lazy_relative_and_submodule_imports(tmp_path):
    src = tmp_path / "packages" / "siirl-data" / "src" / "siirl" / "pkg"
    src.mkdir(parents=True)
    (tmp_path / "tools").mkdir()
    (src / "__init__.py").write_text("")
    (src / "a.py").write_text("def f():\n    from siirl.pkg import b\n")
    (src / "b.py").write_text("from . import c\nfrom .c import _hidden, __version__\n")
    (src / "c.py").write_text("import importlib\nfrom os import _exit\n"
                              "importlib.import_module('siirl.pkg.a')\n")
    modules = build_graph(tmp_path)
    edges = {name: sorted(i.target for i in m.imports if i.ours)
             for name, m in modules.items()}
    assert edges["siirl.pkg.a"] == ["siirl.pkg.b"]
    assert edges["siirl.pkg.b"] == ["siirl.pkg.c", "siirl.pkg.c"]  # a module, then names
    assert find_cycles(modules) == [["siirl.pkg.a", "siirl.pkg.b", "siirl.pkg.c",
                                     "siirl.pkg.a"]]
    assert sorted(v.split(" imports ")[1] for v in private_imports(modules)) == \
        ["_hidden from siirl.pkg.c"]  # os._exit is a third-party name: outside the rule


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
