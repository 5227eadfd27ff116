"""Configuration sections owned by the packages that read them.

A backend, rollout or environment package registers each of its sections under the entry
point group ``siirl.config`` as a ``ConfigSection``: the dataclass of its keys, where it
mounts in the schema (one ``Mount`` per dotted path: ``critic.megatron``,
``actor_rollout_ref.actor.fsdp_config``, ...), the value of the mount's selector key under
which the run reads it (``critic.strategy=megatron``) and its own key rules. siirl-core
composes ``SiiRLArguments`` from what is installed (``siirl.params.compose``) and adds one
general rule per mount: a section whose selector names something else does not apply (one
notice when set). A section may instead splice its keys into an existing group
(``Mount(splice=True)``: the rollout engines' knobs, flat in ``actor_rollout_ref.rollout`` as
in verl). So core never names a backend's keys, and a new backend is one package::

    [project.entry-points."siirl.config"]
    toy = "toy_backend.config:SECTION"

Sections are read once, when the schema is first asked for (``siirl.params``): the module an
entry point names imports only ``siirl.params.sections``, ``run_shape`` and the rule modules
(``key_rule_kinds``, ``key_conditions``) and its own light modules, never the schema or an
engine module.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from siirl.params.key_conditions import get
from siirl.params.key_rule_kinds import Rule, notice
from siirl.params.run_shape import custom_workflow, role_runs, size, workers, workers_text
from siirl.plugins import available, load_plugin

# with the registration types, the facts about the run (run_shape) that a section's rules
# and constraints read: all a section's module imports from core besides the rule modules
__all__ = ["GROUP", "SPLICE_AFTER", "ConfigSection", "Mount", "actor_module_rollout",
           "applying_mounts", "custom_workflow", "free_form", "installed_names",
           "installed_sections", "mounted_at", "own_engine_rollout", "role_runs",
           "section_applies", "section_constraints", "section_rules", "section_run_problems",
           "section_selected_by", "section_value_rules", "size", "workers", "workers_text"]

GROUP = "siirl.config"
SPLICE_AFTER = "splice_after"  # a spliced key's field metadata: the sibling it follows


@dataclasses.dataclass(frozen=True)
class Mount:
    """One place a section sits in the schema."""

    path: str  # dotted path of the field it becomes, e.g. "critic.megatron"
    role: str  # what its rules call the owner: actor, reference, critic, reward_model...
    # the key whose value picks what the run uses there (critic.strategy); None: the
    # owner of the mount writes its own rules (the section adds none there)
    selector: Optional[str] = None
    after: Optional[str] = None  # the sibling field it follows in the schema (None: last)
    # splice: the section's keys join the existing group at ``path`` as its own keys (the
    # rollout engines' knobs in ``actor_rollout_ref.rollout``, where verl has them), each
    # after the sibling its field's ``SPLICE_AFTER`` metadata names, else after the
    # section's previous key (the first: after ``after``, or last)
    splice: bool = False

    @property
    def parent(self) -> str:
        return self.path.rsplit(".", 1)[0] if "." in self.path else ""

    @property
    def group(self) -> str:
        """The group it adds keys to: its parent's, or a splice's own path."""
        return self.path if self.splice else self.parent

    @property
    def field_name(self) -> str:
        return self.path.rsplit(".", 1)[-1]


def _no_rules(mount: Mount) -> Sequence[Rule]:
    return ()


def _no_problems(config: Any) -> List[str]:
    return []


def _no_run_problems(config: Any, device_type: Optional[str]) -> List[str]:
    return []


@dataclasses.dataclass(frozen=True)
class ConfigSection:
    """A section of the configuration and the rules of its keys."""

    # the dataclass of its keys (its default instance is the default), or ``dict[str, X]``
    # for a free-form mapping whose entries the user names (empty by default)
    schema: Any
    mounts: Tuple[Mount, ...]
    applies_to: Tuple[str, ...] = ()  # selector values under which the run reads it
    label: str = ""  # how notices name it ("megatron settings apply only when ...")
    # rules at each mount (where a selector picks the section: only then), on its own keys
    # and on the owner's keys this backend cannot honour; checked before core's rules, the
    # first that matches and holds decides
    rules: Callable[[Mount], Sequence[Rule]] = _no_rules
    # relations between keys this backend needs, one line per problem (validation pass)
    constraints: Callable[[Any], List[str]] = _no_problems
    # the workers that read the same rows in one model of a role it runs (tensor x pipeline
    # parallel peers; None: not a usable size); without it, 1: every worker is a data
    # parallel rank of the role
    model_parallel: Optional[Callable[[Any], Optional[int]]] = None
    model_parallel_keys: str = ""  # the keys that set it, as messages name them
    # the range of each of its keys on its own (siirl.params.value_rules.ValueRule)
    value_rules: Tuple[Any, ...] = ()
    # (importable module, package, pip line) the backend needs where a role runs on it,
    # named by the validation pass when this machine lacks it
    requires: Tuple[str, ...] = ()
    # the same, per selector value, where each choice needs its own package (the rollout
    # section's: vllm needs vllm, sglang sglang); a choice it does not name needs ``requires``
    requires_for: Mapping[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict,
                                                                     hash=False)
    # problems of its settings for this run that depend on the device it computes on
    # ("cuda"/"cpu", None where not known yet), one line each, named last by the
    # validation pass (the vllm rollout's free_cache_engine needs CUDA, ...)
    run_problems: Callable[[Any, Optional[str]], List[str]] = _no_run_problems
    # (tag, why) of its not-applying notice where the general one ("<label> settings apply
    # only when <selector>=...") is not what its users know
    not_applying: Tuple[str, str] = ()
    # a rollout's: the selector values (rollout names) whose rollout is an engine of its
    # own that takes the actor's weights by weight sync (vllm, sglang); a rollout no
    # section names samples with the actor's own module (hf): see ``own_engine_rollout``
    weight_synced: Tuple[str, ...] = ()
    # the names its package provides, by table: "lr_schedules" (what optim.warmup_style /
    # lr_scheduler_type may name), "builtin_models" (model.path's builtin:... names). Each is
    # a collection read when asked (installed_names), so a name added to it in this process
    # counts too; core keeps no copy.
    names: Mapping[str, Collection[str]] = dataclasses.field(default_factory=dict, hash=False)
    # the metadata of the field it becomes: ``help`` (a free-form mapping's line in --help;
    # a dataclass's is its docstring), and for a mapping ``entries`` (what an entry holds,
    # key -> text) and ``example`` (an override adding one), shown by --help PATH
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not (dataclasses.is_dataclass(self.schema) or free_form(self.schema)):
            raise TypeError(f"a config section's schema must be a dataclass or a "
                            f"dict[str, ...], not {self.schema!r}")

    def default_factory(self) -> Callable[[], Any]:
        """What makes the section's default value (a free-form mapping's: ``dict``)."""
        return dict if free_form(self.schema) else self.schema


def free_form(schema: Any) -> bool:
    """Whether ``schema`` is a free-form mapping (``dict[str, ...]``), not a dataclass."""
    return typing.get_origin(schema) is dict


def _load_sections() -> Dict[str, ConfigSection]:
    sections = {}
    for name in available(GROUP):
        section = load_plugin(GROUP, name)
        if not isinstance(section, ConfigSection):
            raise TypeError(f"entry point '{name}' in group '{GROUP}' must name a "
                            f"siirl.params.sections.ConfigSection, not {type(section).__name__}")
        sections[name] = section
    return sections


_SECTIONS: Optional[Dict[str, ConfigSection]] = None


def installed_sections() -> Dict[str, ConfigSection]:
    """Every registered section by entry-point name (read once per process)."""
    global _SECTIONS
    if _SECTIONS is None:
        _SECTIONS = _load_sections()
    return _SECTIONS


def installed_names(table: str) -> List[str]:
    """The names every installed section lists in ``table`` (``ConfigSection.names``), each
    once, in the order the sections and their tables give them."""
    names: List[str] = []
    for section in installed_sections().values():
        names += [n for n in section.names.get(table, ()) if n not in names]
    return names


def mounted_at(path: str) -> Optional[ConfigSection]:
    """The section mounted at ``path``, or None."""
    for section in installed_sections().values():
        if any(m.path == path and not m.splice for m in section.mounts):
            return section
    return None


def section_applies(section: ConfigSection, mount: Mount, config: Any) -> bool:
    """Whether the run reads ``section`` at ``mount`` (its selector names the section)."""
    if mount.selector is None:
        return True
    return str(get(config, mount.selector)) in section.applies_to


def applying_mounts(section: ConfigSection, config: Any) -> List[Mount]:
    """The mounts with a selector where the run reads ``section`` for a role that runs."""
    return [m for m in section.mounts if m.selector is not None and
            section_applies(section, m, config) and role_runs(config, m.role)]


def section_selected_by(selector: str, config: Any) -> Optional[ConfigSection]:
    """The section ``selector`` (e.g. ``critic.strategy``) picks in ``config``, or None."""
    for section in installed_sections().values():
        for mount in section.mounts:
            if mount.selector == selector and section_applies(section, mount, config):
                return section
    return None


def own_engine_rollout(config: Any, key: str = "") -> bool:
    """Whether the run's rollout is an engine of its own that takes the actor's weights by
    weight sync (a section names it in ``weight_synced``); else it samples with the actor's
    own module. A key rule's condition, as ``key_conditions``'."""
    return any(m.selector is not None and str(get(config, m.selector)) in s.weight_synced
               for s in installed_sections().values() for m in s.mounts)


def actor_module_rollout(config: Any, key: str = "") -> bool:
    """Whether the run's rollout samples with the actor's own module (hf): no weight sync."""
    return not own_engine_rollout(config, key)


def _not_applying(section: ConfigSection, mount: Mount) -> Rule:
    names = " or ".join(section.applies_to)
    keys = tuple(f"{mount.path}.{f.name}" for f in dataclasses.fields(section.schema)) \
        if mount.splice else f"{mount.path}.*"
    tag, why = section.not_applying or (
        f"no effect unless {mount.selector.rsplit('.', 1)[-1]}="
        f"{'/'.join(section.applies_to)}",
        f"{section.label} settings apply only when {mount.selector}={names}.")
    return notice(keys, tag, why, lambda config, key: not section_applies(section, mount, config))


def _while_applying(rule: Rule, section: ConfigSection, mount: Mount) -> Rule:
    def when(config: Any, key: str) -> bool:
        return section_applies(section, mount, config) and rule.when(config, key)

    return dataclasses.replace(rule, when=when)


def section_rules() -> Tuple[Rule, ...]:
    """The key rules of every installed section: at each mount with a selector the general
    not-applying rule, then the section's own rules, which hold only where it applies; at a
    mount without one, the section's rules as they are."""
    rules: List[Rule] = []
    for section in installed_sections().values():
        for mount in section.mounts:
            if mount.selector is None:
                rules += section.rules(mount)
                continue
            rules.append(_not_applying(section, mount))
            rules += [_while_applying(rule, section, mount) for rule in section.rules(mount)]
    return tuple(rules)


def section_value_rules() -> Tuple[Any, ...]:
    """Every installed section's value rules (the ranges of its keys)."""
    return tuple(rule for section in installed_sections().values()
                 for rule in section.value_rules)


def section_constraints(config: Any) -> List[str]:
    """Every installed section's constraints on ``config``."""
    return [problem for section in installed_sections().values()
            for problem in section.constraints(config)]


def section_run_problems(config: Any, device_type: Optional[str]) -> List[str]:
    """Every installed section's problems for this run on ``device_type``."""
    return [problem for section in installed_sections().values()
            for problem in section.run_problems(config, device_type)]
