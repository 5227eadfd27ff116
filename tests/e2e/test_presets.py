"""Every preset in configs/ runs as shipped (issue 13).

Each ``configs/*.yaml`` (found by glob, so a new preset is covered without editing this
file) trains 2 steps on the built-in model and task with only run-shortening overrides. A
preset whose first line says it needs the user's own model and data must instead stop at
once, before any model loads, with exit code 2 naming every placeholder path it ships.
The workflow files under configs/workflows/ must load as workflows.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PRESETS = sorted(CONFIGS.glob("*.yaml"))
OWN_DATA_MARK = "needs your own model and data"
PATH_KEYS = ("data.train_files", "data.val_files", "actor_rollout_ref.model.path")
# shorten the run only: no validation, no checkpoints, no loggers
SHORT = ["trainer.total_training_steps=2", "trainer.logger=[]",
         "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1"]


# presets a dedicated test already runs as shipped (CI time): preset -> that test
RUN_ELSEWHERE = {
    "agentic_frozenlake.yaml": "tests/e2e/learning_controls/test_agentic_controls.py",
    "embodied_grpo.yaml": "tests/e2e/test_embodied_grpo.py",
    "embodied_srpo.yaml": "tests/e2e/test_embodied_grpo.py",
    "grpo_smollm2.yaml": "tests/e2e/test_grpo_smollm2.py",
}


def needs_vllm(preset: Path) -> bool:
    rollout = (yaml.safe_load(preset.read_text()).get("actor_rollout_ref") or {}).get("rollout")
    return (rollout or {}).get("name") == "vllm"


def preset_param(preset: Path):
    """vLLM presets run where vLLM is installed (the vllm-marked CI step), else skip."""
    if preset.name in RUN_ELSEWHERE:
        return pytest.param(preset, marks=pytest.mark.skip(
            reason=f"{RUN_ELSEWHERE[preset.name]} runs it as shipped"))
    if not needs_vllm(preset):
        return preset
    missing = importlib.util.find_spec("vllm") is None
    return pytest.param(preset, marks=[pytest.mark.vllm, pytest.mark.skipif(
        missing, reason="needs vLLM (bash tools/setup.sh --vllm)")])


def needs_own_data(preset: Path) -> bool:
    return OWN_DATA_MARK in preset.read_text().splitlines()[0].lower()


def run_preset(preset: Path, run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "siirl.main_dag", "--config", str(preset),
                           f"trainer.default_local_dir={run_dir}", *SHORT],
                          capture_output=True, text=True, timeout=300)


def shipped_paths(preset: Path) -> list:
    loaded = yaml.safe_load(preset.read_text())
    found = []
    for key in PATH_KEYS:
        node = loaded
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        found += [node] if isinstance(node, str) else list(node or [])
    return found


def test_configs_has_presets():
    assert PRESETS, f"no presets in {CONFIGS}"


@pytest.mark.parametrize("preset", [preset_param(p) for p in PRESETS], ids=lambda p: p.name)
def test_preset_runs_as_shipped(preset, tmp_path):
    proc = run_preset(preset, tmp_path)
    if needs_own_data(preset):
        paths = shipped_paths(preset)
        assert paths, f"{preset.name} says it needs your own data but names no path"
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr and "Loading weights" not in proc.stderr, \
            proc.stderr[-3000:]
        for path in paths:
            assert path in proc.stderr, (path, proc.stderr[-3000:])
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in
               (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2], records
    if needs_vllm(preset):  # the engine gets the trainer's weights before every rollout
        assert all(r["weight_sync/bytes"] > 0 and "timing_s/weight_sync" in r
                   for r in records), records


def test_workflow_files_load():
    from siirl.execution.dag.config_loader import load_workflow

    workflows = sorted((CONFIGS / "workflows").glob("*.yaml"))
    assert workflows
    for path in workflows:
        assert load_workflow(path).nodes, path


def test_presets_run_elsewhere_are_run_there():
    root = CONFIGS.parent
    for preset, test in RUN_ELSEWHERE.items():
        assert (CONFIGS / preset).is_file(), preset
        assert preset in (root / test).read_text(), (preset, test)
