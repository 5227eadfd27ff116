"""Metric loggers for ``trainer.logger``: console (``console.ConsoleLogger``), tensorboard,
wandb; ``metrics.jsonl`` is always written under ``trainer.default_local_dir``.

Every record carries ``"step"``. Files are appended and flushed per record, so a crash
loses nothing already logged, and a resumed run continues the same file after dropping
the records of steps past its checkpoint (it runs them again): each step appears once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Collection, Dict, List, Optional

from siirl.dag_worker.checkpoint.errors import StorageError
from siirl.dag_worker.walk.console import ConsoleLogger
from siirl.errors import ConfigError
from siirl.params.constraints import unknown_logger_problems


def _finite(value: float):
    return value if math.isfinite(value) else str(value)


def truncate_records(path: str, keep_through: int) -> int:
    """Keep the records of steps <= ``keep_through`` (and no torn last line); how many
    were dropped. Rewritten atomically: a crash leaves the old file or the new one."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return 0
    kept = []
    for line in lines:
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            continue  # a line torn by a crash mid-write
        if isinstance(step, (int, float)) and step <= keep_through:
            kept.append(line)
    dropped = sum(1 for line in lines if line.strip()) - len(kept)
    if dropped:
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
    return dropped


class JsonlLogger:
    """``keep_through``: the step this run starts after (records of later steps are
    dropped first, so a resumed run logs each step once); None appends to what is there."""

    def __init__(self, directory: str, keep_through: Optional[int] = None):
        self.path = os.path.join(directory, "metrics.jsonl")
        try:
            os.makedirs(directory, exist_ok=True)
            if keep_through is not None:
                truncate_records(self.path, keep_through)
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise StorageError(f"{self.path} cannot be written ({reason}); metrics.jsonl "
                               "must be a writable file in trainer.default_local_dir") from exc

    def log(self, step: int, metrics: Dict[str, float]) -> None:
        record = {"step": step, **{k: _finite(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorboardLogger:
    def __init__(self, directory: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ConfigError("trainer.logger includes 'tensorboard' but the tensorboard "
                              "package is missing: pip install tensorboard") from exc
        self.writer = SummaryWriter(log_dir=os.path.join(directory, "tensorboard"))

    def log(self, step: int, metrics: Dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """Offline unless an API key is configured, so a run never waits on the network."""

    def __init__(self, config: Any, directory: str):
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError("trainer.logger includes 'wandb' but the wandb package is "
                              "missing: pip install wandb") from exc
        online = bool(os.environ.get("WANDB_API_KEY")) and \
            os.environ.get("WANDB_MODE", "") != "offline"
        self.run = wandb.init(
            project=config.trainer.project_name, name=config.trainer.experiment_name,
            dir=directory, mode="online" if online else "offline",
            config=dataclasses.asdict(config),
            settings=wandb.Settings(init_timeout=30, silent=True))

    def log(self, step: int, metrics: Dict[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class Tracking:
    """Fan one record out to every configured logger."""

    def __init__(self, loggers: List[Any]):
        self.loggers = loggers

    def log(self, step: int, metrics: Dict[str, float]) -> None:
        for logger in self.loggers:
            logger.log(step, metrics)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


def build_tracking(config: Any, console: bool = True,
                   keep_through: Optional[int] = None,
                   custom_metrics: Collection[str] = ()) -> Tracking:
    names = config.trainer.logger
    names = [names] if isinstance(names, str) else list(names)
    unknown = unknown_logger_problems(names)  # the validation pass refuses it first
    if unknown:
        raise ConfigError(unknown[0])
    directory = config.trainer.default_local_dir
    loggers: List[Any] = [JsonlLogger(directory, keep_through)]
    if "console" in names and console:
        loggers.append(ConsoleLogger(config, custom=custom_metrics))
    if "tensorboard" in names:
        loggers.append(TensorboardLogger(directory))
    if "wandb" in names:
        loggers.append(WandbLogger(config, directory))
    return Tracking(loggers)
