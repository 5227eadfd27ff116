"""Static scan of the source under packages/*/src (siirl/params excluded): which schema keys
some code reads.

Only code counts, never comments or docstrings: the strings of the AST (f-strings with their
placeholders as ``{}``; not batch-field subscripts or attribute names of other objects), the
identifiers, and attribute accesses. A key ``a.b.parent.leaf``
is read when a dotted-key string or an attribute chain is the whole key (``"trainer.seed"``,
``cfg.trainer.seed``); or when a dotted-key string ends in the leaf (``"ppo_epochs"``,
``f"{ACTOR}.use_kl_loss"``, ``"policy_loss.clip_cov_ratio"``) or an attribute chain reads it
from a config object or its parent group (``actor_cfg.ppo_epochs``, ``rollout.top_k``) in a
file that also names the parent group (``optim_cfg``, ``"critic.model.fsdp_config"``); or
when a key that is read takes it by interpolation (``checkpoint.save_contents`` defaults to
``${.contents}``). A leaf name that several groups share (``path``, ``enable``) can pass for
the wrong group: the table decides those.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterable, List, Set

REPO = Path(__file__).resolve().parents[3]
_DOTTED = re.compile(r"^(?:[A-Za-z_{}][\w{}]*\.)*[A-Za-z_][\w]*$")
_CONFIG_NAME = re.compile(r"(config|cfg|args)", re.IGNORECASE)


@dataclass
class FileReads:
    path: Path
    keys: Set[str] = field(default_factory=set)  # dotted-key strings
    attr_paths: Set[str] = field(default_factory=set)  # "cfg.trainer.seed" chains
    aliases: Dict[str, str] = field(default_factory=dict)  # name -> what was assigned to it
    names: Set[str] = field(default_factory=set)  # identifiers and dotted-key segments
    whole_keys_only: bool = False  # aliases.py: only its reads of whole keys count

    def mentions(self, group: str) -> bool:
        return any(group in name for name in self.names)


def _docstrings(tree: ast.AST) -> Set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def _not_config_reads(tree: ast.AST) -> Set[int]:
    """String constants that name something other than a config key: batch fields
    (``batch["responses"]``), object attributes (``getattr(worker, "tokenizer")``) and
    ``.get``/``.pop``/``.set`` on objects not named like a config."""
    found = set()
    for node in ast.walk(tree):
        owner, strings = None, []
        if isinstance(node, ast.Subscript):
            owner, strings = node.value, [node.slice]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("getattr", "hasattr", "setattr"):
                owner, strings = node.args[0], node.args[1:2]
            elif isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "set",
                                                                    "setdefault"):
                owner, strings = func.value, node.args[:1]
        if owner is not None and not _CONFIG_NAME.search(ast.unparse(owner)):
            found.update(id(s) for s in strings if isinstance(s, ast.Constant))
    return found


def _scan(path: Path) -> FileReads:
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _docstrings(tree) | _not_config_reads(tree)
    reads = FileReads(path)
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Attribute):
            reads.names.add(node.attr)
            reads.attr_paths.add(ast.unparse(node))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            reads.aliases[node.targets[0].id] = ast.unparse(node.value)
        elif isinstance(node, ast.Name):
            reads.names.add(node.id)
        elif isinstance(node, ast.arg):
            reads.names.add(node.arg)
        if text is not None and _DOTTED.match(text.replace("{}", "x")):
            reads.keys.add(text)
            reads.names.update(text.split("."))
    return reads


@lru_cache(maxsize=1)
def _section_modules() -> Set[Path]:
    """The modules of the config sections packages register (siirl.config): like
    siirl/params, they declare keys and their rules, which is not reading them."""
    from importlib.metadata import entry_points
    from importlib.util import find_spec

    modules = {Path(find_spec(ep.module).origin).resolve()
               for ep in entry_points(group="siirl.config")}
    # and the groups core's schema imports from a package below it (siirl-data's ``data``)
    import siirl.data_coordinator.settings as data_settings

    return modules | {Path(data_settings.__file__).resolve()}


@lru_cache(maxsize=1)
def scanned() -> List[FileReads]:
    # siirl/params names every key; of it only aliases.py counts: the verl spellings it
    # reads and translates at parse time (trainer.profile_steps) are keys code reads
    sections = _section_modules()
    files = sorted(p for src in (REPO / "packages").glob("*/src") for p in src.rglob("*.py")
                   if ("siirl/params" not in p.as_posix() or p.name == "aliases.py") and
                   p.resolve() not in sections)
    scans = [_scan(p) for p in files]
    for f in scans:
        f.whole_keys_only = f.path.name == "aliases.py"
    return scans


def _attr_reads(f: FileReads, path: str, parent: str, leaf: str) -> bool:
    """``path`` (an attribute chain) reads ``parent.leaf`` of a typed config: ``x.parent.leaf``,
    ``cfg.leaf`` on a config-named object, or ``base.leaf`` where ``base`` was assigned from
    an expression naming the parent group (``base = rollout.val_kwargs if v else rollout``)."""
    if not path.endswith("." + leaf):
        return False
    base = path[:-len(leaf) - 1]
    return base.endswith(parent) or bool(_CONFIG_NAME.search(base)) or \
        parent in f.aliases.get(base, "")


def reads_directly(key: str) -> List[Path]:
    """Files whose code reads ``key`` (see the module docstring)."""
    parts = key.split(".")
    leaf, parent = parts[-1], (parts[-2] if len(parts) > 1 else "")
    found = []
    for f in scanned():
        if key in f.keys:
            found.append(f.path)
            continue
        if any(p.endswith("." + key) for p in f.attr_paths):  # cfg.trainer.seed
            found.append(f.path)
            continue
        if f.whole_keys_only:
            continue
        by_string = any(s == leaf or s.endswith("." + leaf) for s in f.keys)
        by_attr = any(_attr_reads(f, p, parent, leaf) for p in f.attr_paths)
        if (by_string or by_attr) and (not parent or f.mentions(parent)):
            found.append(f.path)
    return found


def names_exactly(key: str) -> List[Path]:
    """Files with a code string naming ``key`` itself: the whole key, its ``parent.leaf``, or
    that after a placeholder prefix (``f"{ROLLOUT}.multi_turn.enable"``)."""
    tail = ".".join(key.split(".")[-2:])
    return [f.path for f in scanned()
            if (key in f.keys if f.whole_keys_only else
                any(s in (key, tail) or (s.startswith("{}") and s.endswith("." + tail))
                    for s in f.keys)) or any(p.endswith("." + key) for p in f.attr_paths)]


def interpolation_sources(defaults: Dict[str, object]) -> Dict[str, Set[str]]:
    """key -> the keys its default interpolates (``${a.b}``, or ``${.sibling}``)."""
    sources: Dict[str, Set[str]] = {}
    for key, default in defaults.items():
        if isinstance(default, str):
            for ref in re.findall(r"\$\{([^}]+)\}", default):
                parent = key.rsplit(".", 1)[0]
                sources.setdefault(key, set()).add(f"{parent}{ref}" if ref.startswith(".")
                                                   else ref)
    return sources


def read_keys(candidates: Iterable[str], defaults: Dict[str, object]) -> Set[str]:
    """Keys among ``candidates`` that code reads, directly or through an interpolation."""
    candidates = set(candidates)
    read = {k for k in candidates if reads_directly(k)}
    sources = interpolation_sources(defaults)
    grown = True
    while grown:
        more = {s for k in read for s in sources.get(k, ()) if s in candidates} - read
        read |= more
        grown = bool(more)
    return read
