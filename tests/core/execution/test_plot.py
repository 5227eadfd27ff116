"""``siirl-plot``: the console script draws runs' metrics.jsonl into a PNG."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from siirl.execution.metric_worker.plot import Run, choose_panels, main


def _script() -> str:
    path = Path(sys.executable).parent / "siirl-plot"
    found = str(path) if path.exists() else shutil.which("siirl-plot")
    assert found, "the siirl-plot console script is not installed"
    return found


def _run_dir(directory: Path, steps: int = 60, kl: bool = False, scale: float = 1.0) -> Path:
    directory.mkdir(parents=True)
    records = [{"step": 0, "val/score/mean": 0.3, "timing_s/validation": 0.1}]
    for step in range(1, steps + 1):
        records.append({"step": step, "critic/score/mean": scale * step / steps,
                        "response_length/mean": 3 + math.sin(step),
                        "actor/kl_loss": 0.01 * step if kl else 0.0, "actor/ppo_kl": 0.0,
                        "actor/entropy": 0.6 - step / (2 * steps), "timing_s/step": 0.3})
        if step % 20 == 0:
            records.append({"step": step, "val/score/mean": 0.3 + step / (2 * steps)})
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


def _plot(*args):
    return subprocess.run([_script(), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_one_run_writes_curves_png(tmp_path):
    run = _run_dir(tmp_path / "main")
    proc = _plot(run)
    assert proc.returncode == 0, proc.stderr
    png = run / "curves.png"
    assert proc.stdout.strip() == str(png)
    # 5 panels (KL is zero throughout: left out) x 2 rows at the default 100 dpi
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == (1600, 560)


def test_two_runs_overlaid_into_one_file_or_each_run(tmp_path):
    a = _run_dir(tmp_path / "a", kl=True)
    b = _run_dir(tmp_path / "b", steps=30, scale=0.5)
    out = tmp_path / "compare" / "both.png"
    proc = _plot(a, b, "--out", out, "--dpi", 50)
    assert proc.returncode == 0, proc.stderr
    with Image.open(out) as image:  # 6 panels with KL (run a has it)
        assert image.size == (960, 280)
    assert not (a / "curves.png").exists()
    assert _plot(a, b).returncode == 0
    assert (a / "curves.png").exists() and (b / "curves.png").exists()


def test_missing_metrics_file_is_a_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = _plot(tmp_path / "empty")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("siirl-plot: error: ") and "metrics.jsonl" in proc.stderr


def test_panels_skip_missing_metrics_and_time_axis_sums_step_times(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    lines = [{"step": 0, "val/score/mean": 0.2},
             {"step": 1, "critic/score/mean": 0.1, "timing_s/step": 2.0},
             {"step": 2, "critic/score/mean": 0.2, "timing_s/step": 3.0},
             {"step": 2, "critic/score/mean": 0.25, "timing_s/step": 1.0},  # resumed run
             {"step": 2, "val/score/mean": "nan"}]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines))
    run = Run(str(run_dir), "r")
    assert [key for _, key in choose_panels([run])] == \
        ["critic/score/mean", "val/score/mean", "timing_s/step"]
    assert run.series("critic/score/mean", wall=True) == ([2.0, 3.0], [0.1, 0.25])
    assert run.series("val/score/mean", wall=False) == ([0], [0.2])  # nan left out


def test_bad_record_is_an_error_with_its_line(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n')
    assert main([str(tmp_path)]) == 2
    assert "metrics.jsonl:2: not a metrics record" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["--no-such-option", "x"]])
def test_usage_errors_exit_2(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
