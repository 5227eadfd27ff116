"""One rule of the key table (``siirl.params.key_rules``): the keys it names, its kind, a
short tag for ``--help``, why it holds with what works instead, and the condition under
which it holds. ``notice`` and ``refused`` build the two kinds:

- not applying (``notice``): the key tunes something this run does not use; setting it
  costs one notice line at start-up;
- refused (``refused``): ignoring the key would change what the user gets; setting it
  stops the run at start-up.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

from siirl.params.key_conditions import Condition

NOT_APPLYING, REFUSED = "not applying", "refused"


def always(config: Any, key: str) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Rule:
    patterns: Tuple[str, ...]  # dotted keys or fnmatch globs ("a.b.*")
    kind: str  # NOT_APPLYING or REFUSED
    tag: str  # short label for --help
    why: str  # why it is ignored and what works instead
    when: Condition = always  # the rule holds only where this is true


def notice(patterns, tag: str, why: str, when: Optional[Condition] = None) -> Rule:
    """A not-applying rule for ``patterns`` (one key or glob, or several)."""
    patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    return Rule(patterns, NOT_APPLYING, tag, why, *([when] if when else []))


def refused(patterns, tag: str, why: str, when: Optional[Condition] = None) -> Rule:
    """A refused rule for ``patterns`` (one key or glob, or several)."""
    patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    return Rule(patterns, REFUSED, tag, why, *([when] if when else []))
