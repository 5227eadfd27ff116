"""Compose the schema from core's groups and the installed sections (``siirl.params.sections``).

Each class on the way from the root to a mount point is rebuilt with the section's field
added where the mount says (after a given sibling, or last), or, for a spliced section, with
each of the section's fields added after the sibling it names, so ``--print-config`` lists
the keys in the order verl's ``ppo_trainer.yaml`` has them. A rebuilt class keeps its name,
docstring and methods and lives in ``siirl.params`` (which binds it there), so pickling (Ray
workers) finds it by that name in any process.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable, Dict, List, Tuple

from siirl.params.sections import SPLICE_AFTER, ConfigSection, Mount

# what dataclasses generate, or holds a field's default: not copied to the rebuilt class
_GENERATED = {"__dict__", "__weakref__", "__dataclass_fields__", "__dataclass_params__",
              "__init__", "__repr__", "__eq__", "__hash__", "__match_args__",
              "__annotations__", "__doc__", "__module__", "__qualname__"}


def _copy_field(f: dataclasses.Field, type_: Any, factory: Any = dataclasses.MISSING
                ) -> Tuple[str, Any, dataclasses.Field]:
    if factory is not dataclasses.MISSING:
        new = dataclasses.field(default_factory=factory, metadata=f.metadata, repr=f.repr)
    elif f.default_factory is not dataclasses.MISSING:
        new = dataclasses.field(default_factory=f.default_factory, metadata=f.metadata,
                                repr=f.repr)
    else:
        new = dataclasses.field(default=f.default, metadata=f.metadata, repr=f.repr)
    return f.name, type_, new


def _rebuilt_factory(factory: Callable[[], Any], new_cls: type) -> Callable[[], Any]:
    """A default factory of ``new_cls`` giving the values the old factory gave (a group
    whose default differs from its class's, e.g. ``OptimArguments(lr=2e-4)``)."""
    if factory is dataclasses.MISSING or isinstance(factory, type):
        return new_cls

    def make() -> Any:
        old = factory()
        return new_cls(**{f.name: getattr(old, f.name) for f in dataclasses.fields(old)})

    return make


def _placement_order(own: List[Tuple[Mount, ConfigSection]], names: List[str], prefix: str
                     ) -> List[Tuple[Mount, ConfigSection]]:
    """``own`` in the order of the sections' names, except that a mount placed after a
    sibling another section adds comes after that one."""
    ordered, known, todo = [], set(names), list(own)
    while todo:
        ready = [(m, s) for m, s in todo if m.after is None or m.after in known]
        if not ready:
            mount = todo[0][0]
            raise TypeError(f"config section at '{mount.path}' is to follow "
                            f"'{prefix}{mount.after}', which is not in the schema")
        ordered += ready
        known.update(m.field_name for m, _ in ready)
        todo = [item for item in todo if item not in ready]
    return ordered


def _splice(mount: Mount, section: ConfigSection, fields: List[Tuple[str, Any, Any]],
            names: List[str], added: set) -> None:
    """Add the fields of a spliced section to its group's ``fields`` (and ``names``): each
    after the sibling its ``SPLICE_AFTER`` metadata names, else after the section's previous
    field (the first: after ``mount.after``, or last)."""
    hints = typing.get_type_hints(section.schema)
    anchor = mount.after
    for f in dataclasses.fields(section.schema):
        anchor = f.metadata.get(SPLICE_AFTER, anchor)
        if f.name in names:
            raise TypeError(f"config section spliced into '{mount.path}' clashes with the "
                            f"existing key '{mount.path}.{f.name}'")
        if anchor is not None and anchor not in names:
            raise TypeError(f"config section spliced into '{mount.path}': its key "
                            f"'{f.name}' is to follow '{mount.path}.{anchor}', which is not "
                            f"in the schema")
        at = names.index(anchor) + 1 if anchor is not None else len(names)
        while at < len(names) and names[at] in added:  # after sections placed there before
            at += 1
        fields.insert(at, _copy_field(f, hints[f.name]))
        names.insert(at, f.name)
        added.add(f.name)
        anchor = f.name


def _rebuild(cls: type, path: str, mounts: List[Tuple[Mount, ConfigSection]],
             rebuilt: Dict[type, type]) -> type:
    prefix = f"{path}." if path else ""
    own = [(m, s) for m, s in mounts if m.group == path and not m.splice]
    below = {m.group[len(prefix):].split(".", 1)[0] for m, _ in mounts
             if m.group.startswith(prefix) and m.group != path}
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        if f.name in below:
            child = type(f.default_factory())
            new_child = _rebuild(child, prefix + f.name, mounts, rebuilt)
            fields.append(_copy_field(f, new_child, _rebuilt_factory(f.default_factory,
                                                                     new_child)))
        else:
            fields.append(_copy_field(f, hints[f.name]))
    names, added = [name for name, _, _ in fields], set()
    for mount, section in mounts:
        if mount.splice and mount.group == path:
            _splice(mount, section, fields, names, added)
    for mount, section in _placement_order(own, names, prefix):
        if mount.field_name in names:
            raise TypeError(f"config section at '{mount.path}' clashes with an existing key")
        at = names.index(mount.after) + 1 if mount.after is not None else len(names)
        while at < len(names) and names[at] in added:  # after sections placed there before
            at += 1
        fields.insert(at, (mount.field_name, section.schema,
                           dataclasses.field(default_factory=section.default_factory(),
                                             metadata=section.metadata)))
        names.insert(at, mount.field_name)
        added.add(mount.field_name)
    namespace = {k: v for k, v in vars(cls).items()
                 if k not in _GENERATED and k not in cls.__dataclass_fields__}
    namespace.update(__doc__=cls.__doc__, __module__="siirl.params")
    new_cls = dataclasses.make_dataclass(cls.__name__, fields, namespace=namespace)
    new_cls.__qualname__ = cls.__name__
    rebuilt[cls] = new_cls
    return new_cls


def _placed(mount: Mount, root: type) -> bool:
    node: Any = root
    for part in mount.path.split("."):
        fields = {f.name: f for f in dataclasses.fields(node)} if \
            dataclasses.is_dataclass(node) else {}
        if part not in fields or fields[part].default_factory is dataclasses.MISSING:
            return False
        node = type(fields[part].default_factory())
    return True


def compose_schema(root: type, sections: Dict[str, ConfigSection]) -> Dict[type, type]:
    """Mount every section on ``root``'s tree; returns {original class: rebuilt class}."""
    mounts = [(m, s) for s in sections.values() for m in s.mounts]
    paths = [m.path for m, _ in mounts if not m.splice]  # splices clash by their keys
    for path in paths:
        if paths.count(path) > 1:
            raise TypeError(f"two config sections mount at '{path}'")
    if not mounts:
        return {}
    rebuilt: Dict[type, type] = {}
    _rebuild(root, "", mounts, rebuilt)
    missing = [m.path for m, _ in mounts if not _placed(m, rebuilt.get(root, root))]
    if missing:
        raise TypeError(f"config sections mount under groups the schema lacks: "
                        f"{', '.join(missing)}")
    return rebuilt
