"""One validation pass over the whole configuration, before anything loads.

It gathers every problem at once, so a user fixes a command in one go rather than one
error per run: the range of each key (``value_rules``), the relations between keys
(``constraints``), the keys this release would ignore (``key_support``, refused ones) and
what this machine lacks for the run (``machine``: a GPU, an optional package).
Each problem is one line naming the key, its value and the rule; ``InvalidConfigError``
carries them as a numbered list (exit status 2 from ``siirl-train``).

A key whose default follows another by interpolation (``critic.ppo_mini_batch_size``
follows the actor's) is checked only when set on its own: a bad source is named once.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
from functools import cache
from typing import Any, Dict, Iterable, List, Tuple

from siirl.errors import ConfigError
from siirl.params.constraints import constraint_problems
from siirl.params.key_paths import value_at
from siirl.params.key_support import (
    REFUSED,
    changed_keys,
    leaf_defaults,
    refused_problems,
    rule_for,
)
from siirl.params.machine import device_problems, machine_view, package_problems, run_device
from siirl.params.sections import section_run_problems, section_value_rules
from siirl.params.value_rules import RULES, USER_CODE_KEYS, ValueRule, is_number, registries

__all__ = ["InvalidConfigError", "config_problems", "format_problems", "name_problems",
           "validate_config", "value_problems"]


class InvalidConfigError(ConfigError):
    """Every problem of a configuration; ``problems`` holds one line each."""

    def __init__(self, problems: Iterable[str]):
        self.problems = list(problems)
        super().__init__(format_problems(self.problems))


def format_problems(problems: List[str]) -> str:
    """One problem as its own line; several as a numbered list under a count."""
    if len(problems) == 1:
        return problems[0]
    return "\n".join([f"{len(problems)} problems in the configuration (nothing was started):"]
                     + [f"  {i}. {p}" for i, p in enumerate(problems, 1)])


def show(value: Any) -> str:
    """A value as the user would type it on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str).replace("NaN", "nan").replace("Infinity", "inf")
    return str(value)


@cache
def rules_for(key: str) -> Tuple[ValueRule, ...]:
    return tuple(r for r in (*RULES, *section_value_rules())
                 if any(fnmatch.fnmatchcase(key, p) for p in r.patterns))


def _lookup(values: Dict[str, Any], key: str, missing: Any) -> Any:
    node: Any = values
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return missing
        node = node[part]
    return node


def _follows_another(default: Any) -> bool:
    return isinstance(default, str) and default.startswith("${")


def _value_problem(key: str, value: Any) -> str:
    if is_number(value) and not math.isfinite(value):
        return f"{key}={show(value)}: must be a finite number"
    for rule in rules_for(key):
        if value is None and rule.optional:
            continue
        if not rule.test(value):
            return f"{key}={show(value)}: {rule.words}"
    return ""


def value_problems(config: Any) -> List[str]:
    """One line per schema key whose value is out of its range (see ``value_rules``)."""
    values = dataclasses.asdict(config)
    changed = changed_keys(config)
    missing = object()
    problems = []
    for key, default in leaf_defaults().items():
        value = _lookup(values, key, missing)
        if value is missing or (_follows_another(default) and key not in changed):
            continue  # absent, or named at the key it follows
        rule = rule_for(key, config) if key in changed else None
        if rule is not None and rule.kind == REFUSED:
            continue  # the refusal names it, with what works instead
        problem = _value_problem(key, value)
        if problem:
            problems.append(problem)
    return problems


def name_problems(config: Any) -> List[str]:
    """Names of estimators, losses... that their registry does not hold, when no user code
    that could register them is configured (else the registry itself checks, at start-up)."""
    if any(value_at(config, key) for key in USER_CODE_KEYS):
        return []
    problems, changed, defaults = [], changed_keys(config), leaf_defaults()
    for keys, registry in registries():
        names = registry.names()
        for key in keys:
            value = value_at(config, key)
            if _follows_another(defaults.get(key)) and key not in changed:
                continue
            if value is not None and value not in names:
                problems.append(f"{key}={show(value)}: must be a registered {registry.what}: "
                                f"{', '.join(names)} (or one your own code registers)")
    return problems


def config_problems(config: Any) -> List[str]:
    """Every problem of a parsed configuration (the typed ``SiiRLArguments``): ranges, names,
    relations, refused keys, and what this machine lacks for it (a GPU, an optional package;
    ``siirl.params.machine``)."""
    return value_problems(config) + name_problems(config) + constraint_problems(config) + \
        refused_problems(machine_view(config)) + device_problems(config) + \
        package_problems(config) + section_run_problems(config, run_device(config))


def validate_config(config: Any) -> None:
    """Raise ``InvalidConfigError`` listing every problem of ``config``."""
    problems = config_problems(config)
    if problems:
        raise InvalidConfigError(problems)
