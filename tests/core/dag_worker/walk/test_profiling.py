"""profiler.* (siiRL) and verl's trainer.profile_steps: a Chrome trace per profiled step
and worker, or per chosen node with discrete; other steps, workers and validation's nodes
are not traced."""

import json

import torch

from siirl.dag_worker.walk.profiling import StepProfiler
from siirl.params.parser import parse_config


def _config(tmp_path, *overrides):
    return parse_config([f"trainer.default_local_dir={tmp_path}", *overrides])


def _work():
    a = torch.randn(32, 32)
    return (a @ a).sum()


def _events(path):
    return json.loads(path.read_text())["traceEvents"]


def test_a_profiled_step_writes_one_trace_per_worker(tmp_path):
    profiler = StepProfiler(_config(tmp_path, "trainer.profile_steps=[2]"), rank=0)
    for step in (1, 2, 3):
        with profiler.step(step):
            _work()
    trace = tmp_path / "profile" / "step_2" / "rank0.json"
    assert profiler.written == [trace]
    assert any("aten::mm" in e.get("name", "") for e in _events(trace))


def test_only_the_chosen_ranks_trace(tmp_path):
    cfg = _config(tmp_path, "profiler.enable=true", "profiler.profile_steps=[1]",
                  "profiler.ranks=[1]", f"profiler.save_path={tmp_path / 'traces'}")
    idle, busy = StepProfiler(cfg, rank=0), StepProfiler(cfg, rank=1)
    for profiler in (idle, busy):
        with profiler.step(1):
            _work()
    assert idle.written == [] and busy.written == [tmp_path / "traces/step_1/rank1.json"]
    everyone = _config(tmp_path, "profiler.enable=true", "profiler.profile_steps=[1]",
                       "profiler.all_ranks=true")
    assert StepProfiler(everyone, rank=5).on


def test_discrete_traces_the_chosen_nodes_of_profiled_steps_only(tmp_path):
    profiler = StepProfiler(_config(tmp_path, "profiler.enable=true",
                                    "profiler.profile_steps=[1]", "profiler.discrete=true",
                                    "profiler.roles=[generate,actor_train]"), rank=0)
    with profiler.node("rollout_actor", "generate"):  # validation: outside any step
        _work()
    with profiler.step(1):
        for node, method in (("rollout_actor", "generate"), ("function_reward",
                                                             "compute_reward"),
                             ("actor_train", "train_actor")):
            with profiler.node(node, method):
                _work()
    step = tmp_path / "profile" / "step_1"
    assert profiler.written == [step / "rollout_actor_rank0.json",
                                step / "actor_train_rank0.json"]
    assert not (step / "rank0.json").exists()


def test_off_by_default(tmp_path):
    profiler = StepProfiler(_config(tmp_path), rank=0)
    with profiler.step(0), profiler.node("rollout_actor", "generate"):
        _work()
    assert not profiler.on and profiler.written == []
