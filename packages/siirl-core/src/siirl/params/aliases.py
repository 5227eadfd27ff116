"""verl's spellings of keys this schema names otherwise, moved to their place after the
overrides are applied (so a pasted verl script means here what it means there), and
siiRL's implied settings.

- ``reward_model.reward_kwargs.overlong_buffer_cfg.{enable,len,penalty_factor,log}``
  (verl's DAPO recipe) -> ``reward_model.overlong_buffer.*``;
- ``reward_model.reward_kwargs.max_resp_len`` (the same recipe: the length the overlong
  penalty counts from) must equal ``data.max_response_length``, which the reward managers
  read; it is then dropped, as the managers take no such keyword;
- ``algorithm.adv_estimator=cpgd`` turns on ``actor_rollout_ref.actor.use_cpgd_loss``, as
  siiRL's launcher does;
- verl's ``trainer.profile_steps`` (a list of steps) turns on ``profiler.enable`` for
  ``profiler.profile_steps`` = those steps;
- verl's ``reward_manager.name`` (its newer spelling of ``reward_model.reward_manager``, which
  it still reads) -> ``reward_model.reward_manager``, the manager the reward role builds;
  with ``reward_manager.source=importlib`` it is the class loaded from
  ``reward_manager.module.path`` (``siirl.dag_worker.walk.reward_manager_file``). The two set to
  different managers is a conflict;
- a backend's other names (verl's ``strategy=fsdp2``, its FSDP2 spelling, for ``fsdp``: both
  select siiRL's FSDP2 backend), written as the backend's own name wherever a key picks one
  (``canonical_backend_names``), so every reader, ``--print-config`` included, sees one name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, List, Tuple

from omegaconf import DictConfig, OmegaConf, open_dict

from siirl.params import SiiRLArguments
from siirl.params.reward_args import RewardModelArguments
from siirl.params.sections import installed_sections

KWARGS = "reward_model.reward_kwargs"
OVERLONG = "reward_model.overlong_buffer"
MANAGER, LEGACY_MANAGER = "reward_manager", "reward_model.reward_manager"


def apply_aliases(cfg: DictConfig) -> List[str]:
    """Move the aliased keys in place; the problems found (unknown sub-keys, conflicts)."""
    canonical_backend_names(cfg)
    # cfg is the DictConfig being composed: the schema's groups read as attributes
    if str(cfg.algorithm.adv_estimator).lower() == "cpgd":
        OmegaConf.update(cfg, "actor_rollout_ref.actor.use_cpgd_loss", True)
    steps = cfg.trainer.profile_steps
    if steps:
        OmegaConf.update(cfg, "profiler.enable", True)
        OmegaConf.update(cfg, "profiler.profile_steps", list(steps), merge=False)
    problems = _reward_manager_choice(cfg)
    kwargs = cfg.reward_model.reward_kwargs
    if not isinstance(kwargs, DictConfig):
        return problems
    with open_dict(cfg):
        buffer_cfg = kwargs.pop("overlong_buffer_cfg", None)
        if buffer_cfg is not None:
            target = cfg.reward_model.overlong_buffer
            if not isinstance(buffer_cfg, DictConfig):
                problems.append(f"{KWARGS}.overlong_buffer_cfg={buffer_cfg!r}: must be a "
                                f"mapping of {', '.join(target)} (verl's name for {OVERLONG})")
            else:
                for key, value in buffer_cfg.items():
                    if key not in target:
                        problems.append(f"{KWARGS}.overlong_buffer_cfg.{key}: unknown; verl's "
                                        f"overlong buffer takes {', '.join(target)}")
                        continue
                    OmegaConf.update(cfg, f"{OVERLONG}.{key}", value, merge=True)
        max_resp_len = kwargs.pop("max_resp_len", None)
        limit = cfg.data.max_response_length
        if max_resp_len is not None and max_resp_len != limit:
            problems.append(f"{KWARGS}.max_resp_len={max_resp_len} differs from "
                            f"data.max_response_length={limit}: the overlong penalty counts "
                            "from data.max_response_length here; set the two equal")
    return problems


def _reward_manager_choice(cfg: DictConfig) -> List[str]:
    """``reward_manager.name`` set (not following ``reward_model.reward_manager`` by its
    default interpolation) becomes ``reward_model.reward_manager``."""
    section = cfg.reward_manager
    if not isinstance(section, DictConfig):
        return []
    importlib_source = section.get("source") == "importlib"
    named = not OmegaConf.is_interpolation(section, "name")
    problems: List[str] = []
    if importlib_source and not named:
        problems.append(f"{MANAGER}.source=importlib needs {MANAGER}.name: the class to load "
                        f"from {MANAGER}.module.path")
    if importlib_source and not section.module.path:
        problems.append(f"{MANAGER}.source=importlib needs {MANAGER}.module.path: the Python "
                        f"file (or pkg://module) holding the class {MANAGER}.name")
    if not named:
        return problems
    name = section.get("name")
    legacy = cfg.reward_model.reward_manager
    if legacy not in (_LEGACY_DEFAULT, name):
        what = "the class to load" if importlib_source else "the same choice"
        problems.append(f"{MANAGER}.name={name!r} and {LEGACY_MANAGER}={legacy!r} name two "
                        f"reward managers ({MANAGER}.name is verl's newer key for {what}): "
                        "set one of them")
    elif name:
        OmegaConf.update(cfg, LEGACY_MANAGER, name)
    return problems


_LEGACY_DEFAULT = RewardModelArguments().reward_manager


# a section's name table (``ConfigSection.names``) of the other names of the backend it
# applies to (``applies_to[0]``): ``names={"aliases": ("fsdp2",)}`` on the fsdp section
ALIASES = "aliases"


def _schema_fields(node: Any = SiiRLArguments, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """(dotted key, field) of every leaf of the schema."""
    for f in dataclasses.fields(node):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            yield from _schema_fields(type(default), f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f


def backend_aliases() -> Dict[str, Dict[str, str]]:
    """key -> {alias: backend} for each key an alias may be written at: the selectors of the
    section declaring it, and every key whose names come from the same registry as one of
    those selectors (its field's ``names``: ``reward_model.strategy`` names a training
    backend as ``actor_rollout_ref.actor.strategy`` does)."""
    fields = dict(_schema_fields())
    at: Dict[str, Dict[str, str]] = {}
    for section in installed_sections().values():
        aliases = section.names.get(ALIASES, ())
        if not aliases:
            continue
        selectors = {m.selector for m in section.mounts if m.selector is not None}
        sources = [fields[s].metadata.get("names") for s in selectors if s in fields]
        keys = selectors | {k for k, f in fields.items()
                            if f.metadata.get("names") is not None and
                            f.metadata.get("names") in sources}
        for key in keys:
            at.setdefault(key, {}).update({alias: section.applies_to[0] for alias in aliases})
    return at


def canonical_backend_names(cfg: DictConfig) -> None:
    """Write each backend alias set in ``cfg`` as the backend's own name, in place. A key
    that interpolates another (``ref.strategy`` follows ``actor.strategy``) is left as it
    is: the key it follows is written."""
    for key, aliases in sorted(backend_aliases().items()):
        parent_key, leaf = key.rsplit(".", 1)
        parent = cfg
        for part in parent_key.split("."):
            parent = parent[part]
        if OmegaConf.is_interpolation(parent, leaf):
            continue
        value = parent[leaf]
        if isinstance(value, str) and value in aliases:
            parent[leaf] = aliases[value]
