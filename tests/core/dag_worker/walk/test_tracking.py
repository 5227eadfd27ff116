"""Metric loggers: metrics.jsonl always, console summary, tensorboard and offline wandb."""

import json

import pytest

from siirl.dag_worker.walk.tracking import build_tracking
from siirl.errors import ConfigError
from siirl.params.typed import to_typed


def _config(tmp_path, loggers):
    return to_typed({"trainer": {"logger": loggers, "default_local_dir": str(tmp_path),
                                 "project_name": "p", "experiment_name": "e"}})


def test_jsonl_and_console(tmp_path, capsys):
    tracking = build_tracking(_config(tmp_path, ["console"]))
    tracking.log(1, {"critic/score/mean": 0.5, "timing_s/step": 1.25})
    tracking.log(1, {"val/score/mean": 0.25})
    tracking.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "critic/score/mean": 0.5, "timing_s/step": 1.25},
                     {"step": 1, "val/score/mean": 0.25}]
    out = capsys.readouterr().out
    assert "step 1:" in out and "critic/score/mean=0.5" in out


def test_jsonl_appends_across_runs_and_keeps_nan_readable(tmp_path):
    for step in (1, 2):
        tracking = build_tracking(_config(tmp_path, []))
        tracking.log(step, {"x": float("nan")})
        tracking.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2] and lines[0]["x"] == "nan"


def test_unknown_logger_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="mlflowz"):
        build_tracking(_config(tmp_path, ["mlflowz"]))


def test_tensorboard_writes_events(tmp_path):
    pytest.importorskip("tensorboard")
    tracking = build_tracking(_config(tmp_path, ["tensorboard"]))
    tracking.log(3, {"a/b": 1.0})
    tracking.close()
    assert any((tmp_path / "tensorboard").iterdir())


def test_wandb_runs_offline_without_key(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracking = build_tracking(_config(tmp_path, ["wandb"]))
    tracking.log(1, {"a": 1.0})
    tracking.close()
    runs = [p.name for p in (tmp_path / "wandb").iterdir()]
    assert any(name.startswith("offline-run-") for name in runs)
