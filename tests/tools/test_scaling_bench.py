"""tools/bench/scaling.py: its machine probe and one job run (the 2-worker comparison
itself is what the benchmark is for; the multi-worker path is tested in tests/e2e)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("scaling", ROOT / "tools/bench/scaling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_probe_times_one_process_and_two_at_once():
    result = load().probe(iterations=3)
    assert result["alone_s"] > 0 and result["together_s"] > 0
    assert result["efficiency"] == result["alone_s"] / result["together_s"]


def test_one_worker_run_reports_step_nodes_and_start_up():
    run = load().run_job(1, steps=3, per_worker=4, timeout=300,
                         overrides=["actor_rollout_ref.rollout.n=2"])
    assert run["steps_measured"] == 1 and run["step_s"] > 0
    assert run["cpu_per_step_s"] is None or run["cpu_per_step_s"] >= 0  # None: no /proc
    assert {"rollout_actor", "actor_train", "step"} <= set(run["nodes"])
    assert run["to_first_step_s"] > 0 and run["databuffer_bytes"] == 0


def _job(step_s, cpu, actor_train):
    return {"step_s": step_s, "cpu_per_step_s": cpu, "to_first_step_s": 5.0,
            "databuffer_bytes": 0, "steps_measured": 4,
            "nodes": {"step": step_s, "actor_train": actor_train}}


def test_summary_gives_each_layout_its_efficiency(capsys):
    bench = load()
    rounds = []
    for scale in (1.0, 1.2, 0.9):  # medians over rounds, whatever their order
        rounds.append({"probe": {"efficiency": 0.9},
                       "1": _job(0.1 * scale, 0.1, 0.07),
                       "shard": _job(0.25 * scale, 0.2, 0.2),
                       "replicate": _job(0.125 * scale, 0.11, 0.09)})
        entry = rounds[-1]
        entry["efficiency"] = {k: entry["1"]["step_s"] / entry[k]["step_s"]
                               for k in bench.LAYOUTS}
        entry["cpu_efficiency"] = {k: 0.1 / entry[k]["cpu_per_step_s"] for k in bench.LAYOUTS}
    summary = bench.summarize(rounds)
    assert set(summary["layouts"]) == {"shard", "replicate"}
    assert summary["layouts"]["shard"]["efficiency"] == 0.4
    assert summary["layouts"]["replicate"]["efficiency"] == 0.8
    assert abs(summary["layouts"]["replicate"]["relative_to_probe"] - 0.8 / 0.9) < 1e-12
    assert summary["layouts"]["replicate"]["nodes"]["actor_train"] == 0.09
    bench.print_table(summary, type("Args", (), {"prompts_per_worker": 32, "rounds": 3}))
    out = capsys.readouterr().out
    assert "replicate  efficiency 0.80" in out and "shard      efficiency 0.40" in out


def test_replicate_layout_sets_fsdp_size_one_for_every_fsdp_role():
    layouts = load().LAYOUTS
    assert layouts["shard"] == []
    assert sorted(layouts["replicate"]) == sorted([
        "actor_rollout_ref.actor.fsdp_config.fsdp_size=1",
        "actor_rollout_ref.ref.fsdp_config.fsdp_size=1",
        "critic.model.fsdp_config.fsdp_size=1"])
