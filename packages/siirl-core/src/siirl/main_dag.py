"""``python -m siirl.main_dag ...``: the spec's entry point, the same as ``siirl-train``.

The command line lives in :mod:`siirl.launch.cli`; this module stays so the documented
``python -m siirl.main_dag`` (and ``from siirl.main_dag import main``) keep working.
"""

import sys

from siirl.launch.cli import main
from siirl.launch.job import run

__all__ = ["main", "run"]

if __name__ == "__main__":
    sys.exit(main())
