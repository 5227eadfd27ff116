"""Ulysses sequence parallelism end to end (CPU, gloo, Ray): one PPO step on 2 workers that
form one sequence-parallel group (actor, reference and critic split every packed
sequence in two) logs the metrics of the plain 1-worker run, within float tolerance."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SMALL = ["algorithm.adv_estimator=gae", "data.train_batch_size=8",
         "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
         "critic.ppo_micro_batch_size_per_gpu=4",
         "actor_rollout_ref.actor.use_kl_loss=true",  # a reference forward too
         "actor_rollout_ref.model.use_remove_padding=true",
         "critic.model.use_remove_padding=true",
         "trainer.logger=[]", "trainer.val_before_train=false", "trainer.test_freq=-1",
         "trainer.save_freq=-1", "trainer.device=cpu", "trainer.total_training_steps=1",
         "trainer.seed=7"]
SPLIT = ["trainer.n_gpus_per_node=2", "trainer.ray_address=local",
         "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
         "critic.ulysses_sequence_parallel_size=2"]
IGNORED = ("timing_s/", "perf/", "timing/", "databuffer/")
TOL = 1e-5
# Loaded by every python of the run (PYTHONPATH): each process whose attention exchanges
# over a sequence-parallel group writes its pid once.
SPY = """
import importlib.abc, importlib.util, os, sys

class _Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "siirl.engine.fsdp.ulysses":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            real, seen = module.all_to_all, []

            def counting(*args):
                if not seen:
                    seen.append(1)
                    with open(os.environ["ULYSSES_SPY"], "a") as out:
                        out.write(f"{os.getpid()}\\n")
                return real(*args)

            module.all_to_all = counting

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Spy())
"""


def first_step(run_dir, *overrides, env=None):
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths
    command = [sys.executable, "-m", "siirl.main_dag", f"trainer.default_local_dir={run_dir}",
               f"trainer.ray_temp_dir={ray_dir}", *SMALL, *overrides]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled",
                                   RAY_ADDRESS="", **(env or {})))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text()
               .splitlines()]
    (step,) = [r for r in records if "critic/score/mean" in r]
    return {k: v for k, v in step.items()
            if not k.startswith(IGNORED) and isinstance(v, (int, float))}


def test_a_split_step_logs_the_one_worker_steps_metrics(tmp_path):
    plain = first_step(tmp_path / "plain")
    (tmp_path / "spy").mkdir()
    (tmp_path / "spy" / "sitecustomize.py").write_text(SPY)
    spy = tmp_path / "exchanged"
    path = os.pathsep.join(p for p in (str(tmp_path / "spy"), os.environ.get("PYTHONPATH"))
                           if p)
    split = first_step(tmp_path / "split", *SPLIT,
                       env={"PYTHONPATH": path, "ULYSSES_SPY": str(spy)})
    assert len(set(spy.read_text().split())) == 2  # both workers ran split attention
    assert split.keys() == plain.keys()
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/vf_loss",
                "critic/values/mean"):
        assert key in plain
    for key, value in plain.items():
        assert abs(split[key] - value) <= TOL * max(1.0, abs(value)), (key, value, split[key])
