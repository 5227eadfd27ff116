"""Engine classes are built by composition: every class under siirl.engine that has a parent
and defines ``__init__`` calls its parent's ``__init__`` (no half-built engines that skip
their base's set-up)."""

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "packages/siirl-engine/src/siirl/engine"
NO_INIT_BASES = {"object", "ABC", "Protocol", "Exception", "RuntimeError", "ValueError", "Enum"}


def _calls_parent_init(func: ast.FunctionDef, bases: list) -> bool:
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "__init__"):
            continue
        owner = node.func.value
        if isinstance(owner, ast.Call) and getattr(owner.func, "id", "") == "super":
            return True
        if isinstance(owner, ast.Name) and owner.id in bases:
            return True
    return False


def test_every_engine_class_with_a_parent_calls_its_init():
    offenders = []
    for path in sorted(ENGINE.rglob("*.py")):
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in cls.bases]
            if not set(bases) - NO_INIT_BASES:
                continue
            init = next((f for f in cls.body if isinstance(f, ast.FunctionDef)
                         and f.name == "__init__"), None)
            if init is not None and not _calls_parent_init(init, bases):
                offenders.append(f"{path.relative_to(ENGINE)}:{cls.lineno} {cls.name}")
    assert not offenders, offenders


def test_engines_read_typed_config_not_dotted_keys():
    """Engines read the schema's dataclasses (``common.config.typed_config``), built once,
    instead of ``select(config, "a.b.c", default)`` calls whose defaults drift apart."""
    readers = [str(path.relative_to(ENGINE)) for path in sorted(ENGINE.rglob("*.py"))
               if "config_select" in path.read_text()]
    assert not readers, readers
