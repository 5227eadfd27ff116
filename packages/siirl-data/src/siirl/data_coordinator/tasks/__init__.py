"""Built-in datasets generated on the fly (verl row schema).

Names are loaded lazily (PEP 562) so that ``python -m siirl.data_coordinator.tasks.arithmetic``
does not import the module twice (runpy warns when the package already imported it).
"""

import importlib

_EXPORTS = {
    "make_rows": "arithmetic",
    "make_splits": "arithmetic",
    "problem_space": "arithmetic",
    "write_jsonl": "arithmetic",
    "write_parquet": "arithmetic",
}

# the built-in tasks (``data.builtin_task``), each a module here with ``make_splits`` and
# ``write_parquet``; the first is the default
TASK_NAMES = ("arithmetic", "repeat", "chat_arithmetic")

__all__ = sorted([*_EXPORTS, "TASK_NAMES", "task_module"])


def task_module(name: str):
    """The module of built-in task ``name`` (one of :data:`TASK_NAMES`)."""
    if name not in TASK_NAMES:
        from siirl.errors import DataError

        raise DataError(f"unknown built-in task '{name}' (data.builtin_task); known: "
                        f"{', '.join(TASK_NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
