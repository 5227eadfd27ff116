"""The config sections siiRL's distributions ship (``siirl.params.provided_sections``): the
table of where they mount matches what they mount, and a key of one whose package is not
installed (siirl-envs' multi_turn and custom_envs here) stops with the pip line that provides
it, wherever it is set; a free-form mapping is a section like a dataclass is."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from siirl import plugins
from siirl.params.compose import compose_schema
from siirl.params.provided_sections import MOUNTS
from siirl.params.sections import ConfigSection, Mount, installed_sections

REPO = Path(__file__).resolve().parents[3]


def test_the_table_is_where_the_shipped_sections_mount():
    shipped = plugins.PROVIDED["siirl.config"]
    assert set(MOUNTS.values()) <= set(shipped), "every entry names a shipped section"
    for name, section in installed_sections().items():
        if name not in shipped:
            continue
        mounted = {m.path for m in section.mounts if not m.splice}
        listed = {path for path, owner in MOUNTS.items() if owner == name}
        assert listed == mounted, (f"siirl.params.provided_sections.MOUNTS: the section "
                                   f"'{name}' mounts at {sorted(mounted)}")


# as if siirl-envs were not installed: its entry points are not listed
WITHOUT_ENVS = """
import sys, importlib.metadata as md
listed = md.entry_points
def entry_points(**kw):
    return md.EntryPoints([e for e in listed(**kw)
                           if e.dist is None or e.dist.name != "siirl-envs"])
md.entry_points = entry_points
"""
CLI = "from siirl.launch.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _without_envs(*args: str, code: str = CLI) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_ENVS + code, *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize("args, key", [
    (["actor_rollout_ref.rollout.multi_turn.enable=true"],
     "actor_rollout_ref.rollout.multi_turn.enable"),
    (["+custom_envs.Sok.env_type=sokoban"], "custom_envs.Sok.env_type"),
    (["--config", "configs/agentic_sokoban.yaml"], "custom_envs"),
    (["--help", "custom_envs"], "custom_envs"),
])
def test_a_key_of_a_section_not_installed_names_its_package(args, key):
    proc = _without_envs(*args, "--print-config")
    assert proc.returncode == 2, proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert f"'{key}'" in error and 'pip install "siirl-envs"' in error, error
    assert "unknown config key" not in error


def test_core_runs_without_the_envs_sections():
    proc = _without_envs("--print-config")
    assert proc.returncode == 0, proc.stderr
    assert "multi_turn" not in proc.stdout and "custom_envs" not in proc.stdout
    # core's reader of rollout.multi_turn.enable takes it as off where the section is absent
    proc = _without_envs(code=(
        "from siirl.params.typed import to_typed\n"
        "from siirl.dag_worker.walk.engines import WorkerEngines\n"
        "config = to_typed(None)\n"
        "assert not hasattr(config.actor_rollout_ref.rollout, 'multi_turn')\n"
        "print(WorkerEngines(config, None)._multi_turn('rollout', 'hf'))\n"))
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


def test_a_free_form_mapping_is_a_section():
    @dataclasses.dataclass
    class Root:
        """A root."""

        first: int = 0

    section = ConfigSection(schema=dict[str, Any], mounts=(Mount("things", "demo"),),
                            metadata={"help": "Things by name."})
    rebuilt = compose_schema(Root, {"things": section})[Root]
    field = {f.name: f for f in dataclasses.fields(rebuilt)}["things"]
    assert rebuilt().things == {} and field.metadata["help"] == "Things by name."
    with pytest.raises(TypeError, match="dataclass or a dict"):
        ConfigSection(schema=list[str], mounts=(Mount("things", "demo"),))
