"""The ``siirl-train`` command line (also ``python -m siirl.main_dag``).

Usage: siirl-train [--config FILE.yaml] [--print-config] [--print-dag] [--traceback]
                   [key=value ...]
       siirl-train --help [GROUP] | --version

A usage mistake (an unknown option) exits 2 with a one-line hint. A user mistake (unknown
key, cyclic DAG, missing plugin, bad dataset row) is printed as one short paragraph with
exit code 2; ``--traceback`` or ``SIIRL_TRACEBACK=1`` shows the full
Python traceback instead.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from siirl.dag_worker.walk import startup
from siirl.errors import ConfigError, SiirlError
from siirl.launch import signals
from siirl.launch.config import format_config, load_config
from siirl.launch.job import run
from siirl.plugins import GROUPS, available

DISTRIBUTIONS = ("siirl-data", "siirl-core", "siirl-engine", "siirl-envs")
USAGE = """usage: siirl-train [--config FILE.yaml] [--print-config] [--print-dag] [--traceback]
                   [key=value ...]
       siirl-train --help [GROUP] | --version

Train with the DAG workflow chosen by the configuration. Every setting is a dotted key;
override any of them as key=value (Hydra syntax; lists as [a,b]; +key=value adds to a
free-form dict).

options:
  --config FILE     preset YAML merged over the defaults before the overrides
                    (see configs/ in the repository)
  --print-config    print the resolved configuration as YAML and exit
                    (also: --cfg job, as with Hydra)
  --print-dag       print the workflow and each worker's planned graph, then exit
  --traceback       on error, show the full Python traceback (or SIIRL_TRACEBACK=1)
  --help [GROUP]    this help, or every key of GROUP with its default
  --version         the versions of the four siirl distributions
"""


class UsageError(SiirlError):
    """A malformed command line (not a configuration mistake)."""

    exit_code = 2


def installed_plugins() -> str:
    """What each plugin group has installed: read from the entry points, never a list
    of names that may not exist."""
    lines = ["", "installed plugins (entry-point groups):"]
    for group, what in GROUPS.items():
        names = ", ".join(available(group)) or "none"
        lines.append(f"  {group:<24} {names}   ({what})")
    return "\n".join(lines)


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def one(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    return "\n".join(f"{dist} {one(dist)}" for dist in DISTRIBUTIONS)


def parse_argv(argv: List[str]) -> dict:
    opts = {"config": None, "print_config": False, "print_dag": False, "traceback": False,
            "help": None, "version": False, "overrides": []}
    args = iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            opts["help"] = next(args, "")
        elif arg == "--config" or arg.startswith("--config="):
            opts["config"] = arg.split("=", 1)[1] if "=" in arg else next(args, None)
            if not opts["config"]:
                raise UsageError("--config needs a file path")
        elif arg == "--print-config":
            opts["print_config"] = True
        elif arg == "--cfg" or arg.startswith("--cfg="):
            what = arg.split("=", 1)[1] if "=" in arg else next(args, None)
            if what not in ("job", "all"):
                raise UsageError(f"--cfg takes 'job' or 'all', not {what!r} (see siirl-train "
                                 "--help)")
            opts["print_config"] = True
        elif arg == "--version":
            opts["version"] = True
        elif arg == "--print-dag":
            opts["print_dag"] = True
        elif arg == "--traceback":
            opts["traceback"] = True
        elif arg.startswith("--"):
            raise UsageError(f"unknown option '{arg}' (see siirl-train --help)")
        else:
            opts["overrides"].append(arg)
    return opts


def main(argv: Optional[List[str]] = None) -> int:
    if argv is None:  # this process is the command (not a caller's): tune its start-up
        startup.relax()
        signals.handle_sigterm()
    argv = sys.argv[1:] if argv is None else argv
    show_traceback = os.environ.get("SIIRL_TRACEBACK", "") not in ("", "0") or \
        "--traceback" in argv
    if show_traceback:
        os.environ["SIIRL_TRACEBACK"] = "1"  # worker failures then carry their traceback
    # like `python -m`: the user's own modules (dag.custom_pipeline_fn=my_module:fn, a
    # custom reward file) import from the folder the command runs in
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        opts = parse_argv(argv)
        if opts["version"]:
            return _print(versions())
        if opts["help"] is not None:
            from siirl.params.help import format_help
            text = format_help(opts["help"])
            return _print(USAGE + text + "\n" + installed_plugins() if not opts["help"]
                          else text)
        config = load_config(opts["overrides"], opts["config"])
        if opts["print_config"]:
            return _print(format_config(config).rstrip("\n"))
        run(config, print_dag=opts["print_dag"])
        return 0
    except SiirlError as exc:
        if show_traceback:
            raise
        # A config mistake needs no traceback; a failing node or plugin may.
        hint = "" if isinstance(exc, (ConfigError, UsageError)) else \
            " (--traceback shows the full traceback)"
        print(f"siirl-train: error: {exc}{hint}", file=sys.stderr)
        return getattr(exc, "exit_code", 1)
    except KeyboardInterrupt as exc:
        signals.ignore_further()  # a second Ctrl-C must not cut the shutdown short
        terminated = signals.terminated(exc)
        print(f"siirl-train: {'terminated' if terminated else 'interrupted'}; the last "
              "committed checkpoint is kept", file=sys.stderr)
        return 143 if terminated else 130


def _print(text: str) -> int:
    """Print to stdout; a reader that closed the pipe early (``| head``) is not an error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # no further writes to the closed pipe, not even the interpreter's final flush
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
