"""Keep library noise the user cannot act on off the console while a run trains.

* Warnings raised inside a library of ``LIBRARIES`` (the warning's file lies in that package
  under site-packages) go to ``<trainer.default_local_dir>/warnings.log``: megatron-core's
  "Apex is not installed. Falling back to Torch Norm", torch.distributed deprecations of
  the collectives megatron calls, transformers deprecations... A warning attributed to
  siiRL or to the user's own code is shown as usual. Rank 0 prints one line saying how
  many went to the file (``announce``).
* Deprecation notices a library logs through :mod:`logging` instead (transformers'
  ``logger.warning_once("... is deprecated ...")``) go to the same file: a filter on the
  handlers of the root logger and of the libraries' own loggers (transformers installs its
  handler when first imported, so its logging is set up here before the run loads it).
* When stderr is not a terminal (a log file, a pipe, a Ray worker), Hugging Face progress
  bars ("Loading weights", "Writing model shards") are switched off: they would fill the
  log with carriage returns.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import warnings
from typing import Any, List, Optional

from siirl.dag_worker.walk.console import is_terminal, write_line

LIBRARIES = ("megatron", "transformer_engine", "apex", "torch", "transformers",
             "huggingface_hub", "accelerate", "tensordict", "vllm")
_HF_BARS_ENV = "HF_HUB_DISABLE_PROGRESS_BARS"


def library_of(filename: str) -> Optional[str]:
    """The package of ``LIBRARIES`` an installed file belongs to, or None."""
    parts = os.path.normpath(str(filename)).split(os.sep)
    for i, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages"):
            return parts[i + 1] if parts[i + 1] in LIBRARIES else None
    return None


class QuietLibraries:
    """A context manager around a worker's run (set-up included)."""

    def __init__(self, directory: str, rank: int = 0, world_size: int = 1):
        self.path = os.path.join(directory, "warnings.log")
        self.prefix = f"[rank {rank}] " if world_size > 1 else ""
        self.count = 0
        self.libraries: List[str] = []
        self._file: Any = None
        self._shown = None
        self._undo: List[Any] = []
        self._announced = False
        self._filter = _LoggedDeprecations(self)
        self._filtered: List[logging.Handler] = []

    def __enter__(self) -> QuietLibraries:
        self._shown = warnings.showwarning
        warnings.showwarning = self._showwarning
        if "transformers" not in sys.modules and importlib.util.find_spec("transformers"):
            import transformers.utils.logging  # noqa: F401  (its handler exists from here)
        self.watch_loggers()
        if not is_terminal(sys.stderr):
            self._quiet_progress_bars()
        return self

    def watch_loggers(self) -> None:
        """Filter the handlers the root and library loggers have now (call again once a
        library that adds its own, vLLM say, is loaded)."""
        for name in (None, *LIBRARIES):
            for handler in logging.getLogger(name).handlers:
                if handler not in self._filtered:
                    handler.addFilter(self._filter)
                    self._filtered.append(handler)

    def __exit__(self, *exc_info) -> None:
        warnings.showwarning = self._shown
        for handler in self._filtered:
            handler.removeFilter(self._filter)
        self._filtered.clear()
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        if self._file is not None:
            self._file.close()
            self._file = None

    def _showwarning(self, message, category, filename, lineno, file=None, line=None):
        library = library_of(filename)
        if library is None:
            self._shown(message, category, filename, lineno, file, line)
            return
        self.keep(library, warnings.formatwarning(message, category, filename, lineno, line))

    def keep(self, library: str, text: str) -> None:
        """Write one library warning to the file, counted for ``announce``."""
        if self._file is None:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(self.prefix + text)
        self._file.flush()
        self.count += 1
        if library not in self.libraries:
            self.libraries.append(library)

    def announce(self, stream: Any = None) -> None:
        """Once: how many warnings went to the file, and where."""
        if self._announced or not self.count:
            return
        self._announced = True
        others = " (with the other workers')" if self.prefix else ""
        write_line(f"note: {self.count} library warning(s) ({', '.join(self.libraries)}) that "
                   f"need no action are in {self.path}{others}", stream or sys.stderr)

    def _quiet_progress_bars(self) -> None:
        old = os.environ.get(_HF_BARS_ENV)
        os.environ[_HF_BARS_ENV] = "1"  # read when huggingface_hub is first imported
        self._undo.append(lambda: os.environ.pop(_HF_BARS_ENV, None) if old is None
                          else os.environ.__setitem__(_HF_BARS_ENV, old))
        hub = sys.modules.get("huggingface_hub")  # already imported: switch them off now
        if hub is not None and not hub.utils.are_progress_bars_disabled():
            hub.utils.disable_progress_bars()
            self._undo.append(hub.utils.enable_progress_bars)
        transformers = sys.modules.get("transformers")
        if transformers is not None and transformers.utils.logging.is_progress_bar_enabled():
            transformers.utils.logging.disable_progress_bar()
            self._undo.append(transformers.utils.logging.enable_progress_bar)


class _LoggedDeprecations(logging.Filter):
    """Holds back a library logger's deprecation notice, writing it to warnings.log."""

    def __init__(self, quiet: QuietLibraries):
        super().__init__()
        self.quiet = quiet
        self.kept: Any = None  # the last record kept: several handlers may see it

    def filter(self, record: logging.LogRecord) -> bool:
        if record is self.kept:
            return False
        library = record.name.split(".", 1)[0]
        if library not in LIBRARIES or record.levelno > logging.WARNING:
            return True
        message = record.getMessage()
        if "deprecat" not in message.lower():
            return True
        self.kept = record
        self.quiet.keep(library, f"{record.levelname} {record.name}: {message}\n")
        return False
