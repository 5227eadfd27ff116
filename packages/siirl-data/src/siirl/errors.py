"""Error types shared by every siiRL distribution.

They live in siirl-data, the bottom of the dependency chain, so that data, core, engine
and envs can all raise them. The CLI prints a ``SiirlError`` as one short paragraph
(no traceback unless ``--traceback`` or ``SIIRL_TRACEBACK=1``); anything else is a bug
and keeps its full traceback.
"""


class SiirlError(Exception):
    """A problem with the user's input: config, pipeline, dataset or plugin choice."""

    exit_code = 1


class ConfigError(SiirlError):
    """An unknown key, a wrong type or an inconsistent combination of settings."""

    exit_code = 2


class PipelineError(SiirlError):
    """A DAG that cannot run: duplicate id, missing dependency, cycle, bad function."""

    exit_code = 2


class PluginNotFoundError(SiirlError):
    """A requested engine, rollout, reward manager, environment or pipeline is not installed."""

    exit_code = 2


class DataError(SiirlError):
    """A dataset file or row that does not match the expected schema."""

    exit_code = 2


class WorkerFailedError(SiirlError):
    """A worker of a multi-worker job raised or died; the job was stopped.

    The message names the worker's rank, process and host and carries its traceback (a
    failing worker's traceback is the useful part, so the CLI prints it in full).
    """

    exit_code = 1

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank
