"""tools/bench/async.py: what it reads from two runs' metrics.jsonl (the runs themselves are
what the benchmark is for; asynchronous training is tested in tests/e2e)."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("async_bench", ROOT / "tools/bench/async.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(folder: Path, walls: list, vals: dict, waits=None) -> Path:
    folder.mkdir()
    lines = []
    for step, wall in enumerate(walls, 1):
        record = {"step": step, "timing_s/step": 0.5, "timing_s/wall": wall}
        if waits is not None:
            record.update({"timing_s/wait_rollout": waits[step - 1],
                           "async/policy_lag/max": float(step % 2)})
        lines.append(record)
    lines += [{"step": s, "val/score/mean": v} for s, v in vals.items()]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder


def test_steps_per_second_wait_share_and_validation_gaps(tmp_path):
    bench = load()
    a = bench.summarize(_write(tmp_path / "a", [1.0, 1.5, 2.0, 2.5, 3.0],
                               {0: 0.2, 2: 0.5, 4: 0.6}, waits=[0.2, 0.1, 0.0, 0.1, 0.0]), 9.0)
    s = bench.summarize(_write(tmp_path / "s", [1.0, 2.0, 3.0, 4.0, 5.0],
                               {0: 0.2, 2: 0.45, 4: 0.62}), 11.0)
    assert a["steps_per_s"] == pytest.approx(2.0) and s["steps_per_s"] == pytest.approx(1.0)
    assert a["wait_share"] == pytest.approx(0.2 / 2.0)  # steps 2..5 only: after start-up
    assert a["lag_max"] == 1.0 and "wait_share" not in s
    row = bench.compare(a, s)
    assert row["ratio"] == pytest.approx(2.0)
    assert row["val_gap_max"] == pytest.approx(0.05) and row["val_gap_last"] == pytest.approx(0.02)
    assert row["val_gap_mean"] == pytest.approx(0.035)
    assert row["async_gain"] == pytest.approx(0.4) and row["sync_gain"] == pytest.approx(0.42)
