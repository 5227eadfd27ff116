"""Train several estimators (and workflows) on 1 or 2 CPU workers, one after another in the
same processes, and write each run's metric history (``<out>/<name>.json``).

``python siirl_estimator_parity.py WORLD OUT NAME [NAME ...]``: WORLD 1 trains in this
process, as ``siirl-train`` does with one worker; WORLD 2 spawns two processes that join
gloo and run what a Ray worker runs (``WorkerProcess``), without starting Ray, so the
processes and their imports are paid once for all the estimators. ``RUNS`` holds each
estimator's settings on the built-in task and model; ``WORKFLOWS`` the AGENTIC and EMBODIED
runs, each a preset of ``configs/`` shrunk to 2 steps of a tiny batch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from siirl.execution.scheduler.process_group_manager import free_port

ROOT = Path(__file__).resolve().parents[2]
MARFT = ROOT / "examples/experimental/marft/config/workflow_marft.yaml"

# 2 steps of a tiny global batch: 4 prompts x 4 samples; the second step trains on
# weights the first changed, so a difference in step 1's update shows in step 2
SMALL = ["data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4",
         "data.max_response_length=8",
         "trainer.total_training_steps=2", "trainer.logger=[]", "trainer.val_before_train=false",
         "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.device=cpu", "trainer.seed=7"]

# estimator -> its settings (the loss a recipe pairs it with, where it has one)
RUNS = {
    "grpo": [],
    "gspo": ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
             "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"],
    "drgrpo": ["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"],
    # B / m is at least rollout.n (m <= B / n groups), so only n = 2 keeps it below the
    # clamp at 3 where a per-worker m would show
    "cpgd": ["algorithm.weight_factor_in_cpgd=clip_filter_like_weight",
             "actor_rollout_ref.rollout.n=2"],
    "rloo": [],
    "reinforce_plus_plus_baseline": [],
    "reinforce_plus_plus": [],
    "opo": [],
    "grpo_passk": [],
    "gpg": ["actor_rollout_ref.actor.policy_loss.loss_mode=gpg"],
    "gae": [],  # PPO: a critic computes the values
    "remax": [],  # its workflow: a greedy baseline rollout before the sampled one
    # siiRL's MARFT workflow file (Reasoner and Actor agents, a critic each), its rollout
    # tensor-parallel size 4 set to 1 so that 1 and 2 workers can run it
    "gae_marft": ["actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2"],
}


# several optimizer steps per training step: each step's 4 prompts in 2 mini-batches of 2
# (the loader gives each worker its share of every mini-batch, so the rows of 1 worker's
# k-th mini-batch are those of the 2 workers' k-th); name -> (estimator, its settings, the
# settings of the 2-worker run only)
MINI_BATCH_RUNS = {
    "grpo_two_mini_batches": ("grpo", ["actor_rollout_ref.actor.ppo_mini_batch_size=2"], []),
    # the critic's mini-batches too
    "gae_two_mini_batches": ("gae", ["actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                     "critic.ppo_mini_batch_size=2"], []),
    # both workers roll out the same prompts (tensor-parallel size 2) and the DataBuffer
    # hands each its half of every mini-batch for training: 8 prompts in 4 mini-batches
    # (balancing the rows by tokens without keeping the mini-batches apart differed by 0.18
    # in step 2's grad norm)
    "grpo_four_mini_batches_tp_rollout": (
        "grpo", ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=2"],
        ["actor_rollout_ref.rollout.tensor_model_parallel_size=2"]),
}


# the runs of the other workflows: name -> (preset under configs/, its settings)
TWO_STEPS = ["trainer.total_training_steps=2", "trainer.logger=[]",
             "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
             "trainer.device=cpu", "trainer.seed=7"]
_AGENTIC = ["data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "critic.ppo_micro_batch_size_per_gpu=8",
            "custom_envs.FrozenLake.env_config.size=3"]
_EMBODIED = ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=4",
             "actor_rollout_ref.actor.ppo_mini_batch_size=2",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
             "actor_rollout_ref.embodied.env.max_steps=24"]
WORKFLOWS = {
    # FrozenLake episodes, scores standardized over the whole batch (every worker's rows)
    "agentic_grpo": ("agentic_frozenlake.yaml", [
        # the words the tiny agent was taught, on the 4x4 map: some episodes fail, so the
        # scores differ, and one worker's episodes end a turn before the other's (it keeps
        # its FSDP-gathering rollout calls paired with an idle one; without, gloo failed)
        *_AGENTIC, "custom_envs.FrozenLake.env_config.size=4",
        "custom_envs.FrozenLake.action_words=null",
        "env_manager.reward_normalization.grouping=batch",
        "env_manager.reward_normalization.method=mean_std"]),
    # PPO with a critic on each turn (step rows: as many as the episodes took turns, padded
    # to the same count on every worker; one mini-batch of them all, as for episode rows)
    "agentic_gae_step": ("agentic_frozenlake.yaml", [
        *_AGENTIC, "algorithm.adv_estimator=gae", "env_manager.mode=step"]),
    # SRPO on one task: each worker plays one group of it, so a failure's progress reward
    # depends on the other worker's successes
    "embodied_srpo": ("embodied_srpo.yaml", [
        *_EMBODIED, "actor_rollout_ref.embodied.env.env_name=reach_red",
        # the axes the tiny VLA was taught, sampled hot: some episodes fail from step 1
        "actor_rollout_ref.embodied.env.action_signs=[]",
        "actor_rollout_ref.rollout.temperature=2.0"]),
    # GRPO on the preset's four tasks, groups filtered by success rate
    "embodied_grpo": ("embodied_grpo.yaml", [*_EMBODIED, "data.train_batch_size=4",
                                             "actor_rollout_ref.actor.ppo_mini_batch_size=4"]),
}


def _marft_workflow(out: str) -> str:
    path = Path(out) / "workflow_marft_tp1.yaml"
    text = MARFT.read_text()
    assert "rollout.tensor_model_parallel_size: 4" in text
    path.write_text(text.replace("rollout.tensor_model_parallel_size: 4",
                                 "rollout.tensor_model_parallel_size: 1"))
    return str(path)


def overrides(name: str, world: int, out: str) -> list:
    workers = [f"trainer.n_gpus_per_node={world}", f"trainer.default_local_dir={out}/{name}.run"]
    if name in WORKFLOWS:
        return [*TWO_STEPS, *WORKFLOWS[name][1], *workers]
    if name in MINI_BATCH_RUNS:
        estimator, split, two_only = MINI_BATCH_RUNS[name]
        split = [*split, *two_only] if world > 1 else split
        base = [s for s in SMALL if s.split("=")[0] not in {o.split("=")[0] for o in split}]
        return [*base, f"algorithm.adv_estimator={estimator}", *RUNS[estimator], *split,
                *workers]
    extra = [f"dag.workflow_path={_marft_workflow(out)}"] if name == "gae_marft" else []
    return [*SMALL, f"algorithm.adv_estimator={name}", *RUNS[name], *extra, *workers]


def preset(name: str):
    """The configs/ file a run starts from (None: the defaults)."""
    return str(ROOT / "configs" / WORKFLOWS[name][0]) if name in WORKFLOWS else None


def _train(name: str, rank: int, world: int, out: str, port: int) -> list:
    from siirl.execution.dag.task_loader import load_pipeline
    from siirl.execution.scheduler.task_scheduler import TaskScheduler
    from siirl.launch.config import load_config

    config = load_config(overrides(name, world, out), preset(name))
    graph = load_pipeline(config)
    if world == 1:
        from siirl.dag_worker.dagworker import DAGWorker
        from siirl.dag_worker.walk.trainer_loop import Trainer

        return Trainer(DAGWorker(graph, config, rank=0, world_size=1)).fit()
    from siirl.launch.worker_process import WorkerProcess

    plan = TaskScheduler(world).schedule(graph)
    group_ranks = [list(a.group_ranks) or list(range(world)) for a in plan]
    return WorkerProcess(rank, world, config)._run("127.0.0.1", port, plan[rank].graph,
                                                   group_ranks, None, {})


def _worker(rank: int, world: int, out: str, names: list) -> None:
    import torch

    torch.set_num_threads(1)  # two processes share a small machine's cores
    for name in names:
        history = _train(name, rank, world, out, _run_port(rank, out, name))
        if rank == 0:
            with open(os.path.join(out, f"{name}.json"), "w") as f:
                json.dump(history, f)


def _run_port(rank: int, out: str, name: str) -> int:
    """A rendezvous port chosen by rank 0 just before the run and read by the others.

    Ports picked for every run up front were taken minutes later by an earlier
    run's own gloo connections (EADDRINUSE, seen in CI), so each run picks its own.
    """
    path = os.path.join(out, f".{name}.port")
    if rank == 0:
        port = free_port()
        with open(path + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(path + ".tmp", path)  # the others never read half a number
        return port
    deadline = time.monotonic() + 600
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: rank 0 never wrote {path}")
        time.sleep(0.05)
    with open(path) as f:
        return int(f.read())


def main(world: int, out: str, names: list) -> None:
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    os.chdir(ROOT)  # the MARFT file names its process and env files from the root
    if world == 1:
        _worker(0, 1, out, names)
        return
    import torch.multiprocessing as mp

    mp.start_processes(_worker, args=(world, out, names), nprocs=world, start_method="spawn")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3:])
