"""``--print-dag`` lists exactly the nodes that run: for each built-in pipeline, the plan's
nodes are the nodes timed (``timing_s/<node>``) in the first step of a real run, the nodes
it leaves out are not timed, and its weight-sync step is (``timing_s/weight_sync``)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ONE_STEP = ["trainer.logger=[]", "trainer.total_training_steps=1", "trainer.test_freq=-1",
            "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.device=cpu",
            "trainer.cpu_threads=1"]
SMALL = ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=16"]
GAE = ["algorithm.adv_estimator=gae"]
RUNS = {
    "grpo": SMALL,
    "ppo_gae": [*SMALL, *GAE],
    "dapo": [*SMALL, "algorithm.workflow_type=DAPO", "algorithm.filter_groups.enable=true",
             "algorithm.filter_groups.metric=acc",
             "algorithm.filter_groups.max_num_gen_batches=8",
             "reward_model.reward_manager=dapo"],
    "ppo_kl_in_reward": [*SMALL, *GAE, "algorithm.use_kl_in_reward=true"],
    "grpo_kl_loss": [*SMALL, "actor_rollout_ref.actor.use_kl_loss=true"],
    "embodied_grpo": ["--config", str(REPO / "configs" / "embodied_grpo.yaml"),
                      "data.train_batch_size=2", "actor_rollout_ref.rollout.n=4",
                      "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                      "actor_rollout_ref.embodied.env.max_steps=24"],
}
# what each run's plan leaves out (and so must not time)
LEFT_OUT = {
    "grpo": {"actor_old_log_prob", "reference_log_prob"},
    "ppo_gae": {"actor_old_log_prob", "reference_log_prob"},
    "dapo": {"actor_old_log_prob", "reference_log_prob"},
    "ppo_kl_in_reward": set(),
    "grpo_kl_loss": {"actor_old_log_prob"},
    # its two passes per batch (ppo_epochs: 2) need the old policy's log-probs
    "embodied_grpo": {"reference_log_prob"},
}
# timings that are not a node's
NOT_NODES = ("step", "setup", "to_first_step", "weight_sync", "validation", "databuffer/",
             "wall")
NODE_LINE = re.compile(r"^\s+(\S+) \[[A-Z_]+/[A-Z_]+\] <- ")


def siirl_train(*args, cwd):
    proc = subprocess.run([sys.executable, "-m", "siirl.main_dag", *args],
                          capture_output=True, text=True, timeout=600, cwd=cwd,
                          env=dict(os.environ, OMP_NUM_THREADS="1", RAY_ADDRESS=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def planned(dag_text):
    """(node ids, left-out ids, weight-sync lines) of the worker plan --print-dag shows."""
    plan = dag_text[dag_text.index("Plan:"):].splitlines()
    nodes = [m.group(1) for m in map(NODE_LINE.match, plan) if m]
    left = [line.split("left out: ", 1)[1].split(":", 1)[0] for line in plan
            if "left out: " in line]
    syncs = [line.strip() for line in plan if line.strip().startswith("weight_sync ")]
    return nodes, left, syncs


@pytest.mark.parametrize("name", sorted(RUNS))
def test_print_dag_lists_the_nodes_the_first_step_runs(name, tmp_path):
    args = [f"trainer.default_local_dir={tmp_path}", *ONE_STEP, *RUNS[name]]
    nodes, left, syncs = planned(siirl_train(*args, "--print-dag", cwd=REPO))
    assert set(left) == LEFT_OUT[name]
    assert not set(nodes) & set(left)
    assert [s.split(" ")[4] for s in syncs] == ["before", "after"], syncs
    siirl_train(*args, cwd=REPO)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text()
               .splitlines()]
    first = next(r for r in records if r.get("step") == 1)
    timed = {key[len("timing_s/"):] for key in first if key.startswith("timing_s/")}
    assert {t for t in timed if not t.startswith(NOT_NODES)} == set(nodes)
    assert "weight_sync" in timed  # the step after the actor's update ran
