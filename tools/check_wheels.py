"""Build the four distributions and check that each installs alone and imports.

    python tools/check_wheels.py          # every wheel alone, then all four together
    python tools/check_wheels.py --quick  # siirl-core alone (must pull siirl-data), all four

Each check runs in a new virtual environment with torch==2.13.0 installed first (so no
package range can pull a CUDA build) and the wheels taken from dist/.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "dist"
PACKAGES = ["siirl-data", "siirl-core", "siirl-engine", "siirl-envs"]
ROOTS = {"siirl-data": "siirl.data_coordinator", "siirl-core": "siirl.execution",
         "siirl-engine": "siirl.engine", "siirl-envs": "siirl.environment"}

# Imports every module the installed siirl distributions ship (listed from their RECORDs,
# so nothing is imported while searching), data and core first, then checks the one-way
# rule: importing all of siirl-data and siirl-core loads no siirl.engine/siirl.environment
# module beyond the config sections they register.
IMPORT_ALL = r"""
import importlib, importlib.metadata as md, importlib.util, sys
def modules(dist):
    try:
        files = md.distribution(dist).files or []
    except md.PackageNotFoundError:
        return []
    names = []
    for f in files:
        parts = f.parts
        if parts[0] == "siirl" and f.suffix == ".py":
            name = ".".join(parts)[:-3]
            names.append(name[: -len(".__init__")] if name.endswith(".__init__") else name)
    return sorted(names)
# The config sections engines and environments register (entry-point group siirl.config)
# are the one way core reaches them while it parses: what loading them imports is allowed.
for ep in md.entry_points(group="siirl.config"):
    ep.load()
plugin_roots = ("siirl.engine", "siirl.environment")
sections = {m for m in sys.modules if m.startswith(plugin_roots)}
lower = modules("siirl-data") + modules("siirl-core")
for name in lower:
    importlib.import_module(name)
leaked = [m for m in sys.modules if m.startswith(plugin_roots) and m not in sections]
assert not leaked, f"siirl-core/siirl-data imported {leaked}"
upper = modules("siirl-engine") + modules("siirl-envs")
has_megatron = importlib.util.find_spec("megatron") is not None
optional = ("siirl.engine.megatron", "siirl.engine.megatron_workers")
for name in upper:
    if has_megatron or not name.startswith(optional):
        importlib.import_module(name)
if not has_megatron:  # siirl-engine without the [megatron] extra never imports it
    assert not [m for m in sys.modules if m.startswith("megatron")], "megatron imported"
print(f"imported {len(lower) + len(upper)} modules (megatron: {has_megatron})")
"""


def run(*cmd, **kw) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def build(isolated: bool) -> None:
    DIST.mkdir(exist_ok=True)
    for old in DIST.glob("siirl*"):
        old.unlink()
    flags = [] if isolated else ["--no-isolation"]
    for package in PACKAGES:
        run(sys.executable, "-m", "build", *flags, "--sdist", "--wheel", "--outdir", DIST,
            ROOT / "packages" / package, stdout=subprocess.DEVNULL)
    for wheel in DIST.glob("*.whl"):
        names = zipfile.ZipFile(wheel).namelist()
        assert "siirl/__init__.py" not in names, f"{wheel.name} ships siirl/__init__.py"


def check_install(requested: list, expect_missing: list, then_all: bool = False) -> None:
    """Install ``requested`` alone in a new venv and check what came with it; with
    ``then_all``, add the other wheels to the same venv and check all four together."""
    with tempfile.TemporaryDirectory() as tmp:
        venv.create(tmp, with_pip=True)
        py = Path(tmp) / "bin" / "python"
        run(py, "-m", "pip", "install", "-q", "torch==2.13.0")
        run(py, "-m", "pip", "install", "-q", "--find-links", DIST, *requested)
        _probe(tmp, py, requested, expect_missing)
        if then_all:
            run(py, "-m", "pip", "install", "-q", "--find-links", DIST, *PACKAGES)
            _probe(tmp, py, PACKAGES, [])
            check_megatron_extra(py, tmp)


def check_megatron_extra(py: Path, tmp: str) -> None:
    """``siirl-engine[megatron]`` brings megatron-core and no CUDA packages (torch CPU is
    already installed), and every megatron module of siirl-engine then imports."""
    run(py, "-m", "pip", "install", "-q", "--find-links", DIST, "siirl-engine[megatron]")
    listed = subprocess.run([py, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                            text=True, check=True).stdout.lower()
    assert "megatron-core==" in listed, "the [megatron] extra did not install megatron-core"
    cuda = [line for line in listed.splitlines()
            if line.startswith(("nvidia-", "cuda-", "transformer-engine", "triton"))]
    assert not cuda, f"the [megatron] extra pulled CUDA packages: {cuda}"
    run(py, "-c", IMPORT_ALL, cwd=tmp)
    print("ok: siirl-engine[megatron]", flush=True)


def _probe(tmp: str, py: Path, requested: list, expect_missing: list) -> None:
    """Check which distributions are present, import them all, run the CLI if installed."""
    probe = ("import importlib.util as u\n"
             + "".join(f"assert u.find_spec('{ROOTS[p]}'), '{p} missing'\n"
                       for p in PACKAGES if p not in expect_missing)
             + "".join(f"assert not u.find_spec('{ROOTS[p]}'), '{p} present'\n"
                       for p in expect_missing))
    run(py, "-c", probe)
    run(py, "-c", IMPORT_ALL, cwd=tmp)
    if requested != ["siirl-data"]:
        run(Path(tmp) / "bin" / "siirl-train", "--print-dag", cwd=tmp,
            stdout=subprocess.DEVNULL)
        # siirl-plot and the matplotlib it draws with come with siirl-core
        run(Path(tmp) / "bin" / "siirl-plot", "--help", cwd=tmp, stdout=subprocess.DEVNULL)
        run(py, "-c", "import matplotlib.backends.backend_agg", cwd=tmp)
    print(f"ok: {' '.join(requested)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one venv: siirl-core alone, then all four added to it")
    parser.add_argument("--no-isolation", action="store_true",
                        help="build with the current environment's setuptools")
    args = parser.parse_args()
    build(isolated=not args.no_isolation)
    alone = {"siirl-data": ["siirl-core", "siirl-engine", "siirl-envs"],
             "siirl-core": ["siirl-engine", "siirl-envs"],
             "siirl-engine": ["siirl-envs"], "siirl-envs": ["siirl-engine"]}
    if args.quick:
        check_install(["siirl-core"], alone["siirl-core"], then_all=True)
        return
    for package in PACKAGES:
        check_install([package], alone[package])
    check_install(PACKAGES, [])


if __name__ == "__main__":
    main()
