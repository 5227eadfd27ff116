"""What a benchmark's JSON records about where and how it ran (for the speed section of
docs/speed.md: every number there names its machine, date and command), and the batches
its rounds take from a dataloader."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys


def _interpreter() -> str:
    """The venv's python as the README names it (``.venv/bin/python``, ``.venv-vllm/...``)."""
    venv = os.path.basename(sys.prefix)
    return f"{venv}/bin/python" if venv.startswith(".venv") else "python"


def run_facts(argv: list | None = None) -> dict:
    """Date, command line, machine and library versions of this run."""
    import torch

    script = os.path.relpath(sys.argv[0]) if sys.argv and sys.argv[0] else "?"
    args = sys.argv[1:] if argv is None else list(argv)
    return {
        "date": datetime.date.today().isoformat(),
        "command": shlex.join([_interpreter(), script, *args]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"
                   + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def write_result(result: dict, out: str, argv: list | None = None) -> None:
    """Add this run's facts to ``result``, write it to ``out`` as JSON and say so."""
    result["run"] = run_facts(argv)
    with open(out, "w") as handle:
        json.dump(result, handle, indent=2)
    print(f"\nwrote {out}")


def batches(loader, count: int):
    """``count`` batches of ``loader``, starting it over whenever it runs out."""
    it = iter(loader)
    for _ in range(count):
        try:
            yield next(it)
        except StopIteration:
            it = iter(loader)
            yield next(it)
