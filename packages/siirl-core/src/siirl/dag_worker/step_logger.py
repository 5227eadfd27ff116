"""Write each step's metrics: a console line and ``metrics.jsonl`` under the run directory."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, Dict, List

from siirl.errors import ConfigError
from siirl.execution.config_select import select


class ConsoleLogger:
    def __init__(self, stream=None):
        self.stream = stream or sys.stdout

    def log(self, step: int, metrics: Dict[str, float]) -> None:
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()))
        print(f"step {step}: {shown}", file=self.stream, flush=True)

    def close(self) -> None:
        pass


class JsonlLogger:
    """One JSON object per step with ``"step"``; appended and flushed so a crash loses
    nothing already logged."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "metrics.jsonl")
        self._file = open(self.path, "a", encoding="utf-8")

    def log(self, step: int, metrics: Dict[str, float]) -> None:
        record = {"step": step}
        record.update({k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class StepLoggers:
    def __init__(self, loggers: List[Any]):
        self.loggers = loggers

    def log(self, step: int, metrics: Dict[str, float]) -> None:
        for logger in self.loggers:
            logger.log(step, metrics)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


SUPPORTED = ("console",)


def build_step_loggers(config: Any) -> StepLoggers:
    loggers: List[Any] = []
    names = select(config, "trainer.logger", ["console"])
    names = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in names if n not in SUPPORTED]
    if unknown:
        raise ConfigError(f"trainer.logger: {unknown} not available (available: "
                          f"{', '.join(SUPPORTED)}; metrics.jsonl is always written)")
    if "console" in names:
        loggers.append(ConsoleLogger())
    directory = select(config, "trainer.default_local_dir")
    if directory:
        loggers.append(JsonlLogger(str(directory)))
    return StepLoggers(loggers)
