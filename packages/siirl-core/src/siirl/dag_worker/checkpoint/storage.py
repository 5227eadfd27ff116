"""The storage side of saving: is the folder writable, is there room, what failed.

The size of the next checkpoint is estimated from the previous one (its manifest), or,
before the first, from the engines' parameters: weights, the Hugging Face export of a
role that has one, and two fp32 Adam moments per parameter. A save goes ahead when the
free space is at least that plus a margin.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional

MARGIN_FRACTION, MARGIN_BYTES = 0.10, 32 << 20
_PARTIAL = re.compile(r"\.global_step_\d+\.partial")
# what torch's and safetensors' writers say when the OS refused a write (they do not
# always raise OSError)
_STORAGE_WORDS = ("no space", "file too large", "read-only", "permission denied",
                  "disk quota", "write failed", "unexpected pos", "i/o error",
                  "input/output error", "os error")


def human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


def engine_bytes(engines: Dict[str, Any]) -> int:
    """A checkpoint's size estimated from the engines' parameters."""
    total = 0
    for engine in engines.values():
        module = getattr(engine, "module", None)
        if module is None:
            module = getattr(getattr(engine, "backend", None), "module", None)
        if module is None or not hasattr(module, "parameters"):
            continue
        params = list(module.parameters())
        if getattr(engine, "optimizer", None) is not None and \
                any(not p.requires_grad for p in params):
            # a trained engine with frozen weights (LoRA) saves its trainable ones only
            params = [p for p in params if p.requires_grad]
        weights = sum(p.numel() * p.element_size() for p in params)
        moments = 8 * sum(p.numel() for p in params) \
            if getattr(engine, "optimizer", None) is not None else 0
        total += weights * (2 if hasattr(engine, "export_hf") else 1) + moments
    return total


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def needed(estimate: int) -> int:
    return int(estimate * (1 + MARGIN_FRACTION)) + MARGIN_BYTES


def prepare(root: Path, partial: Path, estimate: int) -> Optional[str]:
    """Create ``partial`` (fresh) for a save; why it cannot be, or None when it can."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
    except OSError as exc:
        return f"{root} cannot be written ({describe(exc)})"
    free = shutil.disk_usage(root).free
    if free < needed(estimate):
        shutil.rmtree(partial, ignore_errors=True)
        return (f"{root} has {human(free)} free; the checkpoint needs about "
                f"{human(needed(estimate))} (an estimated {human(estimate)} plus a margin)")
    return None


def is_storage_error(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return True
    text = str(exc).lower()
    return isinstance(exc, Exception) and any(word in text for word in _STORAGE_WORDS)


def describe(exc: BaseException) -> str:
    """One line: the OS's words when there are some."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    text = str(exc).strip()
    if any(word in text.lower() for word in ("unexpected pos", "write failed")):
        return ("a file could not be written in full (the disk is full, or a quota or a "
                "file-size limit was reached)")  # torch's zip writer says only this
    lines = text.splitlines()
    return (lines[-1] if lines else type(exc).__name__)[:300]


def clean_stale(root: Path) -> List[str]:
    """Remove ``.global_step_N.partial`` folders a killed save left; their names."""
    if not Path(root).is_dir():
        return []
    removed = []
    for entry in Path(root).iterdir():
        if _PARTIAL.fullmatch(entry.name) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return sorted(removed)


def check_output_dir(root: Path) -> None:
    """Before anything loads: ``trainer.default_local_dir`` is (or can be made) a folder
    this process can write, since metrics, data and checkpoints go there."""
    from siirl.dag_worker.checkpoint.errors import StorageError

    root = Path(root)
    key = f"trainer.default_local_dir={root}"
    if root.exists() and not root.is_dir():
        raise StorageError(f"{key} is a file, not a folder; point it to a folder")
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".siirl-write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StorageError(f"{key} cannot be written ({describe(exc)}); metrics and "
                           "checkpoints go there: choose a folder you can write") from exc
