"""Which configuration keys this release honours, so that none is silently ignored.

Every leaf key of the schema is in one of three classes:

- read: some code reads it and it works (every key no rule in ``RULES`` matches);
- not applying: it tunes a backend or feature this run does not use (vLLM knobs under the
  ``hf`` rollout, megatron keys under FSDP...). Set away from its default it costs one notice
  line at start-up, so pasted verl scripts still run;
- refused: ignoring it would change what the user gets (LoRA, offload, packing, dynamic
  batches, multi-turn...). Set away from its default it stops the run at start-up with a
  ``ConfigError`` naming the key and what works instead.

A key counts as set when its value differs from its schema default; for a default that is an
interpolation (``${actor_rollout_ref.actor.use_dynamic_bsz}``), from that interpolation as
this run resolves it, so only the key the user actually set is named. The table itself is
``siirl.params.key_rules.RULES``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from functools import lru_cache
from typing import Any, Dict, List, Optional, Tuple

from omegaconf import OmegaConf

from siirl.errors import ConfigError
from siirl.params.key_rules import NOT_APPLYING, REFUSED, RULES, Rule

__all__ = ["NOT_APPLYING", "REFUSED", "RULES", "Rule", "changed_keys", "check_key_support",
           "help_tag", "leaf_defaults", "not_applying_notices", "refused_problems", "rule_for"]


# ---- checking a configuration -----------------------------------------------------------

@lru_cache(maxsize=1)
def leaf_defaults() -> Dict[str, Any]:
    """Every leaf key of the schema -> its default (interpolations as ``${...}`` text)."""
    from siirl.params import SiiRLArguments

    leaves: Dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            else:
                leaves[prefix + f.name] = value

    walk(SiiRLArguments(), "")
    return leaves


_REF = re.compile(r"\$\{([^}]+)\}")


def _lookup(values: Dict[str, Any], key: str, missing: Any) -> Any:
    node: Any = values
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return missing
        node = node[part]
    return node


def _resolve_default(default: str, key: str, values: Dict[str, Any]) -> Any:
    """A ``${...}`` default as this run would resolve it (its sources keep the user's values);
    the schema's interpolations are plain references, absolute or ``${.sibling}``."""
    def source(ref: str) -> Any:
        return _lookup(values, key.rsplit(".", 1)[0] + ref if ref.startswith(".") else ref,
                       None)

    whole = _REF.fullmatch(default)
    return source(whole.group(1)) if whole else \
        _REF.sub(lambda m: str(source(m.group(1))), default)


def changed_keys(config: Any) -> Dict[str, Any]:
    """Leaf keys whose value in ``config`` (the typed configuration) differs from the one
    the schema gives them here."""
    values = dataclasses.asdict(config)
    missing = object()
    changed = {}
    for key, default in leaf_defaults().items():
        value = _lookup(values, key, missing)
        if value is missing:
            continue
        if isinstance(default, str) and "${" in default:
            default = _resolve_default(default, key, values)
        if value != default:
            changed[key] = value
    return changed


def rule_for(key: str, config: Any) -> Optional[Rule]:
    """The first rule matching ``key`` whose condition holds in ``config`` (None: read)."""
    for rule in RULES:
        if any(fnmatch.fnmatchcase(key, p) for p in rule.patterns) and rule.when(config, key):
            return rule
    return None


def _grouped(changed: Dict[str, Any], config: Any, kind: str) -> List[Tuple[Rule, List[str]]]:
    # by reason: rules that say the same (a section's and core's, on the same engine's
    # keys) make one line
    groups: Dict[str, Tuple[Rule, List[str]]] = {}
    for key, value in changed.items():
        rule = rule_for(key, config)
        if rule is not None and rule.kind == kind:
            groups.setdefault(rule.why, (rule, []))[1].append(f"{key}={value!r}")
    return list(groups.values())


def refused_problems(config: Any) -> List[str]:
    """One line per reason for the refused keys ``config`` sets (the validation pass)."""
    return [f"{', '.join(keys)}: this release would ignore "
            f"{'it' if len(keys) == 1 else 'them'}: {rule.why}"
            for rule, keys in _grouped(changed_keys(config), config, REFUSED)]


def not_applying_notices(config: Any) -> List[str]:
    """One notice line per reason for the set keys that do not apply to this run."""
    return [f"note: {', '.join(keys)} {'has' if len(keys) == 1 else 'have'} no effect in "
            f"this run: {rule.why}"
            for rule, keys in _grouped(changed_keys(config), config, NOT_APPLYING)]


def check_key_support(config: Any) -> List[str]:
    """Raise ``ConfigError`` naming every refused key that is set; return one notice line per
    reason for the set keys that do not apply to this run."""
    changed = changed_keys(config)
    refused = _grouped(changed, config, REFUSED)
    if refused:
        parts = [f"{', '.join(keys)}: {rule.why}" for rule, keys in refused]
        count = sum(len(keys) for _, keys in refused)
        raise ConfigError("the run stops before it starts, because it would ignore "
                          + ("this setting" if count == 1 else "these settings")
                          + ": " + " ".join(parts))
    return not_applying_notices(config)


@lru_cache(maxsize=1)
def _default_config() -> Any:
    from siirl.params import SiiRLArguments

    # typed like a parsed run's configuration, its interpolated defaults resolved
    return OmegaConf.to_object(OmegaConf.structured(SiiRLArguments))


def help_tag(key: str) -> str:
    """'[refused: ...]' or '[no effect ...]' under the default configuration, for
    ``siirl-train --help GROUP``; '' for a key that is read."""
    rule = rule_for(key, _default_config())
    if rule is None:
        return ""
    return f"[refused: {rule.tag}]" if rule.kind == REFUSED else f"[{rule.tag}]"
