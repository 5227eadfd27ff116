"""Environments in worker processes: a hung, crashing, raising or malformed environment
ends only its own episode, counted by kind, while the others play on."""

import os
import time

import pytest
from test_trajectory_manager import char_tokenizer, scripted

from siirl.environment.agentic import TrajectoryEnvManager
from siirl.environment.agentic.env_workers import EnvWorkerPool
from siirl.environment.base import TextEnv


class Faulty(TextEnv):
    """Wins on "ok"; its ``fault`` strikes at the first step."""

    def __init__(self, fault: str = "none"):
        self.fault = fault

    def reset(self, seed=None):
        return "go"

    def step(self, action):
        if self.fault == "hang":
            time.sleep(600)
        elif self.fault == "exit":
            os._exit(3)
        elif self.fault == "raise":
            raise RuntimeError("broken simulator")
        elif self.fault == "nan":
            return "x", float("nan"), True, {}
        elif self.fault == "text":
            return "x", "lots", True, {}
        return "won", 1.0, True, {"success": True}


@pytest.fixture()
def pool():
    pool = EnvWorkerPool(processes=3, step_timeout_s=3.0)
    yield pool
    pool.close()


def test_faults_cost_only_their_episode(pool):
    tokenizer = char_tokenizer(False)
    manager = TrajectoryEnvManager(tokenizer, max_actions_per_traj=2, error_penalty=-1.0)
    # environments go to the 3 processes in turn: the hang and the exit each take down a
    # process of their own; raise, nan and text share the one that survives
    faults = ["raise", "hang", "exit", "nan", "none", "none", "text", "none", "none", "none"]
    episodes = [manager.start(pool.create(Faulty, {"fault": f}, None), seed=i, group=str(i))
                for i, f in enumerate(faults)]
    script = {tuple(episodes[4].ids): ["<answer>ok</answer>"] * (2 * len(faults))}
    start = time.monotonic()
    manager.run(episodes, scripted(tokenizer, script))
    assert time.monotonic() - start < 30  # the hang cost one timeout, not ten minutes
    by_fault = dict(zip(faults, episodes, strict=True))
    assert by_fault["hang"].error == "timeout" and by_fault["exit"].error == "crash"
    assert by_fault["raise"].error == "step"
    assert by_fault["nan"].error == "malformed" and by_fault["text"].error == "malformed"
    healthy = [e for f, e in zip(faults, episodes, strict=True) if f == "none"]
    # a healthy episode sharing a process with the hung or dead one goes down with it
    survivors = [e for e in healthy if e.error is None]
    assert survivors and all(e.success and e.reward == 1.0 for e in survivors)
    assert all(e.error in ("timeout", "crash") for e in healthy if e.error)
    metrics = manager.metrics(episodes)
    assert metrics["env/errors/timeout"] >= 1 and metrics["env/errors/crash"] >= 1
    assert metrics["env/errors/malformed"] == 2 and metrics["env/errors/step"] == 1
    # the restarted processes serve new environments
    again = manager.start(pool.create(Faulty, {}, None), seed=0, group="x")
    manager.run([again], scripted(tokenizer, {tuple(again.ids): ["<answer>ok</answer>"]}))
    assert again.success
