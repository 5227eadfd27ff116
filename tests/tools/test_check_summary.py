"""tools/gpu/check_summary.py: one line per part of check_all.sh, from its exit status and
the JSON it wrote; a part that failed or wrote nothing is shown as such, never dropped."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_says_what_each_part_did(tmp_path):
    (tmp_path / "main_job.json").write_text(json.dumps({
        "steps": 100, "step_s_median": 0.065, "val_first": 0.325, "val_last": 0.69,
        "val_best": 0.69, "wall_s": 29.0}))
    (tmp_path / "offload.json").write_text(json.dumps({
        "engine": {"checks": {"same metrics": True, "same weights": True}},
        "train": {"checks": {"ran": False}}}))
    (tmp_path / "step_floor.json").write_text("{not json")
    status = tmp_path / "status.tsv"
    status.write_text("main_job\t0\t29\noffload\t1\t58\nstep_floor\t0\t3\n"
                      "megatron\t124\t120\n")
    proc = subprocess.run([sys.executable, str(ROOT / "tools/gpu/check_summary.py"),
                           str(status), str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 1  # a part failed
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()[2:] if line.strip()}
    assert "0.325 -> 0.69" in lines["main_job"] and lines["main_job"].split()[1] == "ok"
    assert "exit 1" in lines["offload"] and "2/3 checks; failed: train: ran" in lines["offload"]
    assert "result unreadable" in lines["step_floor"]
    assert "time limit" in lines["megatron"] and "no result written" in lines["megatron"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [p["part"] for p in summary["parts"]] == ["main_job", "offload", "step_floor",
                                                     "megatron"]


def test_the_async_part_says_when_one_gpu_could_not_run_nccl(tmp_path):
    (tmp_path / "async_sync.json").write_text(json.dumps({
        "gpus": 1, "nccl": False, "channel": {"backend": "gloo", "exact": True,
                                              "bytes": 2e9, "gbps": 1.5, "ok": True}}))
    status = tmp_path / "status.tsv"
    status.write_text("async_sync\t0\t40\n")
    proc = subprocess.run([sys.executable, str(ROOT / "tools/gpu/check_summary.py"),
                           str(status), str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0
    assert "gloo channel exact, 2.00 GB at 1.5 GB/s; two-GPU run skipped (1 GPU)" in proc.stdout
