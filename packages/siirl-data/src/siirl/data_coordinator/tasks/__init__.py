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

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
