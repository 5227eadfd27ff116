"""Build the run's configuration: schema defaults <- preset YAML <- ``key=value`` overrides.

The schema is the ``SiiRLArguments`` dataclass tree (Hydra structured config). Overrides use
Hydra's grammar (``a.b=1``, ``a.list=[x,y]``, ``+a.free_form_dict.k=v``, ``~a.b``). Every
mistake (unknown key, wrong type, bad YAML) becomes a ``ConfigError`` naming the dotted key
and, when one is close, the key the user probably meant. Nothing heavy (torch, engines) is
imported here.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from pathlib import Path
from typing import Any, Iterable, List, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from siirl.errors import ConfigError
from siirl.params import SiiRLArguments
from siirl.params.aliases import apply_aliases
from siirl.params.constraints import check_constraints
from siirl.params.provided_sections import absent_section_problem

SCHEMA_NAME = "siirl_config"


def register_with_hydra() -> None:
    """Store the schema in Hydra's ConfigStore, for users composing with ``@hydra.main``."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=SiiRLArguments)


def schema_paths(node=None, prefix: str = "") -> List[str]:
    """Every dotted key of the schema, groups included."""
    node = SiiRLArguments if node is None else node
    paths = []
    for f in dataclasses.fields(node):
        path = f"{prefix}{f.name}"
        paths.append(path)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            paths.extend(schema_paths(type(default), path + "."))
    return paths


def suggest(key: str) -> str:
    """' (did you mean X?)' for a close schema key, or ''."""
    # Never suggest a group that already contains the key ("trainer" for "trainer.foo").
    paths = [p for p in schema_paths() if not key.startswith(p + ".")]
    # a short or misplaced key first: "rollout.n" for "actor_rollout_ref.rollout.n" (the
    # root rollout section's "rollout.nnodes" is only close in spelling)
    close = [p for p in paths if p.endswith("." + key)][:1]
    if not close:
        close = difflib.get_close_matches(key, paths, n=1, cutoff=0.75)
    if not close:
        leaf = key.rsplit(".", 1)[-1]
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        siblings = [p for p in paths if p.rsplit(".", 1)[0] == parent] if parent else paths
        near = difflib.get_close_matches(leaf, [p.rsplit(".", 1)[-1] for p in siblings],
                                         n=1, cutoff=0.6)
        close = [f"{parent}.{near[0]}" if parent else near[0]] if near else []
    return f" (did you mean {close[0]}?)" if close else ""


def _error_for(exc: OmegaConfBaseException, origin: str, fallback_key: str = "") -> ConfigError:
    key = getattr(exc, "full_key", None) or fallback_key
    kind = type(exc).__name__
    if kind in ("ConfigKeyError", "ConfigAttributeError"):
        return ConfigError(absent_section_problem(key, origin) or
                           f"unknown config key '{key}' in {origin}{suggest(key)}")
    message = str(exc).splitlines()[0]
    return ConfigError(f"bad value for '{key}' in {origin}: {message}")


def _load_preset(path: str) -> DictConfig:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file '{path}' does not exist")
    try:
        loaded = OmegaConf.load(file)
    except Exception as exc:
        raise ConfigError(f"config file '{path}' is not valid YAML: {exc}") from exc
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"config file '{path}' must hold a mapping of groups to keys")
    return loaded


def _parse_override(parser, text: str):
    from hydra.errors import HydraException  # the lexer's errors are not OverrideParseException

    if "=" not in text and not text.startswith("~"):
        raise ConfigError(f"command-line argument '{text}' is not key=value{suggest(text)}")
    try:
        return parser.parse_override(text)
    except HydraException as exc:
        raise ConfigError(f"cannot parse override '{text}': {str(exc).splitlines()[0]} "
                          "(quote a value with special characters: key='...')") from None


_ABSENT = object()


def _node_at(cfg: DictConfig, key: str) -> Any:
    """The value at dotted ``key`` of the config being composed (``cfg`` itself for ""),
    or ``_ABSENT`` where no such key exists or its value is missing (``???``)."""
    node: Any = cfg
    for part in key.split(".") if key else ():
        if isinstance(node, ListConfig) and part.lstrip("-").isdigit() and \
                -len(node) <= int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, DictConfig) and part in node:  # False for a ??? value
            node = node[part]
        else:
            return _ABSENT
    return node


def _is_free_form(cfg: DictConfig, parent_key: str) -> bool:
    """Whether keys may be added under ``parent_key``: the nearest existing ancestor is a
    plain dict (``+custom_envs.Sok.env_type=...`` creates ``Sok`` in free-form
    ``custom_envs``)."""
    parent = _node_at(cfg, parent_key)
    while parent in (None, _ABSENT) and parent_key:
        parent_key = parent_key.rsplit(".", 1)[0] if "." in parent_key else ""
        parent = _node_at(cfg, parent_key)
    return isinstance(parent, DictConfig) and not dataclasses.is_dataclass(
        OmegaConf.get_type(parent))


def _apply_override(cfg: DictConfig, override, text: str) -> None:
    key = override.key_or_group
    parent_key = key.rsplit(".", 1)[0] if "." in key else ""
    origin = f"override '{text}'"
    absent = absent_section_problem(key, origin)  # a key of a section not installed
    if absent:
        raise ConfigError(absent)
    if override.is_delete():
        if _node_at(cfg, key) is _ABSENT:
            raise ConfigError(f"cannot delete unknown key '{key}'{suggest(key)}")
        if not _is_free_form(cfg, parent_key):
            raise ConfigError(f"cannot delete '{key}': it is part of the schema; set it to "
                              "null instead")
        parent = _node_at(cfg, parent_key)
        with open_dict(cfg):
            del parent[key.rsplit(".", 1)[-1]]
        return
    if override.is_sweep_override():  # Hydra reads a,b as alternatives to run in turn
        raise ConfigError(f"{origin}: '{key}' gets a comma-separated value, which Hydra reads "
                          "as a sweep over several runs; siirl-train runs one: quote the "
                          f"value to pass it as one string ({key}='\"a,b\"') or give a list "
                          f"({key}=[a,b]) where the key takes one")
    value = override.value()
    try:
        if override.is_add() or override.is_force_add():
            if not _is_free_form(cfg, parent_key):
                raise ConfigError(f"cannot add '{key}' with '+': '{parent_key or 'the root'}' "
                                  f"has a fixed set of keys{suggest(key)}")
            with open_dict(cfg):
                OmegaConf.update(cfg, key, value, merge=True, force_add=True)
        else:
            if _node_at(cfg, key) is _ABSENT:
                raise ConfigError(f"unknown config key '{key}' in {origin}{suggest(key)}")
            OmegaConf.update(cfg, key, value, merge=True)
    except OmegaConfBaseException as exc:
        raise _error_for(exc, origin, key) from None


def parse_config(overrides: Iterable[str] = (), config_file: Optional[str] = None,
                 check_support: bool = True, validate: bool = False) -> DictConfig:
    """Schema <- ``config_file`` (a preset YAML) <- ``overrides``; returns a resolved,
    struct-mode DictConfig (unknown keys stay errors for later writers too).

    Every bad override (unknown key, wrong type, bad syntax) is reported at once, in one
    ``InvalidConfigError``. With ``validate`` (what ``siirl-train`` does) the same error
    also lists every value out of its range, every relation between keys the values break
    and every refused key (siirl/params/validation.py). Without it only the overlong
    buffer's constraint is checked (siirl/params/constraints.py), so tests and tools may
    build a partial configuration. With ``check_support`` (the default), a key this release
    would ignore stops here with a ``ConfigError`` when ignoring it changes what the user
    gets, and is named in a notice on stderr when it only tunes something this run does not
    use (siirl/params/key_rules.py).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from siirl.params.validation import InvalidConfigError, config_problems

    # Dataclass groups reject unknown keys by themselves; free-form dicts (override_config,
    # reward_kwargs, ...) stay open so a preset may fill them.
    cfg = OmegaConf.structured(SiiRLArguments)
    if config_file:
        try:
            cfg = OmegaConf.merge(cfg, _load_preset(config_file))
        except OmegaConfBaseException as exc:
            raise _error_for(exc, f"config file '{config_file}'") from None
    parser, problems = OverridesParser.create(), []
    for text in overrides:  # a bad override leaves its key at the earlier value
        try:
            _apply_override(cfg, _parse_override(parser, text), text)
        except ConfigError as exc:
            problems.append(str(exc))
    problems += apply_aliases(cfg)  # verl's spellings, where this schema names them
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        raise InvalidConfigError([*problems, str(_error_for(exc, "an interpolation (${...})"))]
                                 ) from None
    OmegaConf.set_struct(cfg, True)
    # the checks below read the typed configuration, made once here
    args = OmegaConf.to_object(cfg)
    if validate:
        problems += config_problems(args)
    if problems:
        raise InvalidConfigError(problems)
    check_constraints(args)  # values that contradict another key: before anything loads
    if check_support:
        from siirl.params.key_support import check_key_support

        for line in check_key_support(args):
            print(f"siirl: {line}", file=sys.stderr)
    return cfg
