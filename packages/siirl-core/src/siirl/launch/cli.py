"""The ``siirl-train`` command line (also ``python -m siirl.main_dag``).

Usage: siirl-train [--config FILE.yaml] [--print-config] [--print-dag] [--traceback]
                   [key=value ...]
       siirl-train --help [GROUP]

A user mistake (unknown key, cyclic DAG, missing plugin, bad dataset row) is printed as one
short paragraph with exit code 2; ``--traceback`` or ``SIIRL_TRACEBACK=1`` shows the full
Python traceback instead.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from siirl.errors import ConfigError, SiirlError
from siirl.launch.config import format_config, load_config
from siirl.launch.job import run

USAGE = """usage: siirl-train [--config FILE.yaml] [--print-config] [--print-dag] [--traceback]
                   [key=value ...]
       siirl-train --help [GROUP]

Train with the DAG workflow chosen by the configuration. Every setting is a dotted key;
override any of them as key=value (Hydra syntax; lists as [a,b]; +key=value adds to a
free-form dict).

options:
  --config FILE     preset YAML merged over the defaults before the overrides
                    (see configs/ in the repository)
  --print-config    print the resolved configuration as YAML and exit
  --print-dag       print the workflow and each worker's planned graph, then exit
  --traceback       on error, show the full Python traceback (or SIIRL_TRACEBACK=1)
  --help [GROUP]    this help, or every key of GROUP with its default
"""


def parse_argv(argv: List[str]) -> dict:
    opts = {"config": None, "print_config": False, "print_dag": False, "traceback": False,
            "help": None, "overrides": []}
    args = iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            opts["help"] = next(args, "")
        elif arg == "--config" or arg.startswith("--config="):
            opts["config"] = arg.split("=", 1)[1] if "=" in arg else next(args, None)
            if not opts["config"]:
                raise SiirlError("--config needs a file path")
        elif arg == "--print-config":
            opts["print_config"] = True
        elif arg == "--print-dag":
            opts["print_dag"] = True
        elif arg == "--traceback":
            opts["traceback"] = True
        elif arg.startswith("--"):
            raise SiirlError(f"unknown option '{arg}' (see siirl-train --help)")
        else:
            opts["overrides"].append(arg)
    return opts


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    show_traceback = os.environ.get("SIIRL_TRACEBACK", "") not in ("", "0") or \
        "--traceback" in argv
    if show_traceback:
        os.environ["SIIRL_TRACEBACK"] = "1"  # worker failures then carry their traceback
    try:
        opts = parse_argv(argv)
        if opts["help"] is not None:
            from siirl.params.help import format_help
            print(USAGE if not opts["help"] else "", end="")
            print(format_help(opts["help"]))
            return 0
        config = load_config(opts["overrides"], opts["config"])
        if opts["print_config"]:
            print(format_config(config), end="")
            return 0
        run(config, print_dag=opts["print_dag"])
        return 0
    except SiirlError as exc:
        if show_traceback:
            raise
        # A config mistake needs no traceback; a failing node or plugin may.
        hint = "" if isinstance(exc, ConfigError) else " (--traceback shows the full traceback)"
        print(f"siirl-train: error: {exc}{hint}", file=sys.stderr)
        return getattr(exc, "exit_code", 1)
    except KeyboardInterrupt:
        print("siirl-train: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
