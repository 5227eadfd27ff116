"""A spliced config section (``Mount(splice=True)``): its keys join an existing group as
that group's own, each after the sibling it names, so a package can own keys that verl
keeps flat in a core group (the rollout engines' knobs in ``actor_rollout_ref.rollout``)."""

import dataclasses
from dataclasses import dataclass, field

import pytest
from omegaconf import OmegaConf

from siirl.params.compose import compose_schema
from siirl.params.sections import SPLICE_AFTER, ConfigSection, Mount


@dataclass
class Group:
    """A core group."""

    name: str = "hf"
    temperature: float = 1.0
    n: int = 8


@dataclass
class Root:
    """The root."""

    group: Group = field(default_factory=Group)


@dataclass
class Knobs:
    """An engine's knobs."""

    mode: str = field(default="sync", metadata={SPLICE_AFTER: "name", "help": "Run mode."})
    timeout_s: float = 3.0  # follows mode
    memory: float = field(default=0.5, metadata={SPLICE_AFTER: "temperature"})
    engine_kwargs: dict = field(default_factory=lambda: {"a": {}}, metadata={SPLICE_AFTER: "n"})


@dataclass
class Sub:
    """A sub-group mounted the usual way."""

    depth: int = 2


def _section(schema, *mounts):
    return ConfigSection(schema=schema, mounts=mounts, applies_to=("engine",), label="test")


def _root(*sections):
    rebuilt = compose_schema(Root, {f"s{i}": s for i, s in enumerate(sections)})
    return rebuilt[Root]


def test_spliced_keys_join_the_group_after_the_siblings_they_name():
    knobs = _section(Knobs, Mount("group", "rollout", "group.name", splice=True))
    group = _root(knobs)().group
    assert [f.name for f in dataclasses.fields(group)] == [
        "name", "mode", "timeout_s", "temperature", "memory", "n", "engine_kwargs"]
    assert (group.mode, group.timeout_s, group.memory) == ("sync", 3.0, 0.5)
    help_of = {f.name: f.metadata.get("help") for f in dataclasses.fields(group)}
    assert help_of["mode"] == "Run mode."
    # a flat key of the group: overridable and typed as the section declares it
    cfg = OmegaConf.merge(OmegaConf.structured(_root(knobs)),
                          OmegaConf.from_dotlist(["group.timeout_s=9", "group.mode=server"]))
    assert (cfg.group.timeout_s, cfg.group.mode) == (9.0, "server")
    with pytest.raises(Exception, match="timeout_s"):
        OmegaConf.merge(cfg, OmegaConf.from_dotlist(["group.timeout_s=soon"]))


def test_a_spliced_default_is_not_shared_between_instances():
    root = _root(_section(Knobs, Mount("group", "rollout", "group.name", splice=True)))
    a, b = root(), root()
    a.group.engine_kwargs["a"]["x"] = 1
    assert b.group.engine_kwargs == {"a": {}}


def test_a_sub_group_may_follow_a_spliced_key():
    knobs = _section(Knobs, Mount("group", "rollout", "group.name", splice=True))
    sub = _section(Sub, Mount("group.sub", "rollout", after="memory"))
    names = [f.name for f in dataclasses.fields(_root(knobs, sub)().group)]
    assert names.index("sub") == names.index("memory") + 1


def test_a_spliced_key_that_clashes_or_follows_a_missing_key_is_named():
    @dataclass
    class Clash:
        """Clashes."""

        temperature: float = 0.7

    @dataclass
    class Lost:
        """Follows a key the group lacks."""

        knob: int = field(default=1, metadata={SPLICE_AFTER: "no_such_key"})

    with pytest.raises(TypeError, match="existing key 'group.temperature'"):
        _root(_section(Clash, Mount("group", "rollout", splice=True)))
    with pytest.raises(TypeError, match="'group.no_such_key', which is not in the schema"):
        _root(_section(Lost, Mount("group", "rollout", splice=True)))


def test_without_an_anchor_spliced_keys_go_last():
    @dataclass
    class Tail:
        """Keys at the end of the group."""

        first: int = 1
        second: int = 2

    group = _root(_section(Tail, Mount("group", "rollout", splice=True)))().group
    assert [f.name for f in dataclasses.fields(group)][-2:] == ["first", "second"]
