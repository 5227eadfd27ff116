"""tools/gpu/wheels.txt carries what a one-process run imports beyond the GPU image's own
packages (tools/gpu/image_packages.txt): checked against the modules a real one-process
run (fsdp and megatron) imports, and against the version ranges siiRL's packages declare."""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "tools" / "gpu"
SIIRL = ("siirl-data", "siirl-core", "siirl-engine", "siirl-envs")
# what the GPU tools use on top of a plain run (siirl-engine's extras)
EXTRAS = {"siirl-engine": {"megatron"}}

PROBE = """
import atexit, json, runpy, sys
if __name__ == "__main__":  # not again in spawned helpers
    out = sys.argv.pop(1)
    atexit.register(lambda: json.dump(sorted({m.split(".")[0] for m in list(sys.modules)}),
                                      open(out, "w")))
    sys.argv[0] = "siirl.main_dag"
    runpy.run_module("siirl.main_dag", run_name="__main__")
"""


def listed(path: Path) -> dict:
    """name -> the line (``name==version`` or a bare name), comments left out."""
    entries = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            entries[canonicalize_name(line.split("==")[0])] = line
    return entries


WHEELS, IMAGE = listed(GPU / "wheels.txt"), listed(GPU / "image_packages.txt")


def needs_carrying() -> set:
    """siiRL's runtime requirements (installed metadata, markers evaluated), transitively,
    stopping at what the image provides (its packages bring their own)."""
    todo, seen, carry = [(name, EXTRAS.get(name, set())) for name in SIIRL], set(), set()
    while todo:
        name, extras = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in md.requires(name) or []:
            req = Requirement(text)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker and not any(req.marker.evaluate(env) for env in envs):
                continue
            dep = canonicalize_name(req.name)
            if dep in IMAGE or dep.startswith("siirl-"):
                if dep.startswith("siirl-"):
                    todo.append((dep, EXTRAS.get(dep, set())))
                continue
            carry.add(dep)
            todo.append((dep, set(req.extras)))
    return carry


def imported_distributions(tmp_path: Path, *overrides: str) -> set:
    probe, out = tmp_path / "probe.py", tmp_path / "modules.json"
    probe.write_text(PROBE)
    proc = subprocess.run(
        [sys.executable, str(probe), str(out), f"trainer.default_local_dir={tmp_path / 'run'}",
         "trainer.total_training_steps=1", "trainer.val_before_train=false",
         "trainer.device=cpu", *overrides],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    owners = md.packages_distributions()
    return {canonicalize_name(d) for m in json.loads(out.read_text()) for d in owners.get(m, [])}


@pytest.mark.parametrize("strategy", ["fsdp", "megatron"])
def test_every_imported_requirement_is_in_the_image_or_carried(strategy, tmp_path):
    if strategy == "megatron":
        pytest.importorskip("megatron.core")
    imported = imported_distributions(tmp_path, f"actor_rollout_ref.actor.strategy={strategy}")
    missing = (imported & needs_carrying()) - set(WHEELS)
    assert not missing, f"add to tools/gpu/wheels.txt: {sorted(missing)}"
    assert "ray" not in imported  # one process needs no Ray (its wheel alone is too large)


def test_each_carried_wheel_is_needed_and_meets_siirls_ranges():
    needed = needs_carrying()
    for name, line in WHEELS.items():
        assert name in needed or name in IMAGE, f"{line}: nothing siiRL needs asks for it"
    declared = [Requirement(t) for pkg in (*SIIRL, *WHEELS) for t in (md.requires(pkg) or [])]
    for req in declared:
        line = WHEELS.get(canonicalize_name(req.name))
        if line and "==" in line and not req.marker:
            assert req.specifier.contains(line.split("==")[1], prereleases=True), \
                f"{line} does not meet {req}"


def test_the_image_list_has_what_the_run_relies_on():
    for name in ("torch", "transformers", "numpy", "pyarrow", "safetensors", "peft", "pyyaml"):
        assert name in IMAGE
    assert not set(WHEELS) & {"torch", "transformers", "ray"}
