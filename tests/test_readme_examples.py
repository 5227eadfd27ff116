"""The README's custom-pipeline example runs as written (issue 13), so it cannot drift.

The test reads README.md and docs/*.md themselves (the example may move between them):
the python block that defines ``my_custom_pipeline`` is written to a temporary user folder
under the file name its first line gives, and the shell line that runs it is run there with
the ``siirl-train`` console script, no PYTHONPATH, and only overrides that shorten the run.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SHORT = ["trainer.total_training_steps=2", "trainer.logger=[]",
         "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1"]


def blocks(lang: str, needle: str) -> list:
    return [body for page in PAGES for kind, body in FENCE.findall(page.read_text())
            if kind == lang and needle in body]


def test_custom_pipeline_example_runs_from_a_user_folder(tmp_path):
    [code] = blocks("python", "def my_custom_pipeline")
    file_name = code.splitlines()[0].lstrip("# ").strip()
    assert file_name.endswith(".py"), code.splitlines()[0]
    (tmp_path / file_name).write_text(code)
    [command] = [line for body in blocks("bash", "dag.custom_pipeline_fn=")
                 for line in body.splitlines() if "dag.custom_pipeline_fn=" in line]
    argv = shlex.split(command.split("#")[0])
    assert argv[0] == "siirl-train", command
    script = Path(sys.executable).parent / "siirl-train"  # the venv's console script
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(script), *argv[1:], f"trainer.default_local_dir={run_dir}",
                           *SHORT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in
               (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all("my_filter/kept" in r for r in records)  # the user's node ran
