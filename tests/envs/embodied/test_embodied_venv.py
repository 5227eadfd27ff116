"""Environments in subprocesses: the batch equals single environments, and a hung,
crashed or raising simulator ends only its own episode, counted, and is restarted."""

import functools
import os
import time

import numpy as np
import pytest

from siirl.environment.embodied import EmbodiedEnvError, Reach2D, VectorEmbodiedEnv
from siirl.errors import ConfigError


class Faulty(Reach2D):
    """A small reach table whose ``fault`` strikes in every step (or at build)."""

    def __init__(self, fault: str = "none"):
        if fault == "build":
            raise RuntimeError("no simulator licence")
        super().__init__(image_size=16)
        self.fault = fault

    def _step(self, chunk):
        if self.fault == "hang":
            time.sleep(600)
        elif self.fault == "exit":
            os._exit(3)
        elif self.fault == "raise":
            raise RuntimeError("broken simulator")
        return super()._step(chunk)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _all_gone(pids, within_s: float = 5.0) -> bool:
    stop = time.monotonic() + within_s
    while time.monotonic() < stop:
        if all(_gone(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def test_vector_equals_single_envs_stepped_in_a_loop():
    tasks, seeds = ["reach_red", "push_blue_up", "push_red_left"], [3, 4, 5]
    singles = [Reach2D(image_size=32) for _ in tasks]
    rng = np.random.default_rng(0)
    with VectorEmbodiedEnv("reach", num_envs=3, config={"image_size": 32}) as venv:
        assert venv.num_envs == 3 and venv.action_dim == 2 and "reach_red" in venv.task_ids
        obs = venv.reset(tasks, seeds)
        want = [env.reset(t, s) for env, t, s in zip(singles, tasks, seeds, strict=True)]
        assert np.array_equal(obs["image"], np.stack([w["image"] for w in want]))
        assert obs["instruction"] == [w["instruction"] for w in want]
        clipped = 0
        for _ in range(6):
            actions = rng.uniform(-1.5, 1.5, size=(3, 3, 2))  # some out of range
            obs, rewards, dones, infos = venv.step(actions)
            for j, env in enumerate(singles):
                o, r, d, info = env.step(actions[j])
                clipped += info["clipped"]
                assert np.array_equal(obs["image"][j], o["image"])
                assert np.array_equal(obs["proprio"][j], o["proprio"])
                assert (rewards[j], dones[j]) == (r, d) and infos[j] == info
        assert obs["image"].dtype == np.uint8 and rewards.dtype == np.float32
        assert venv.clipped == clipped > 0
        assert venv.errors == {"timeout": 0, "crash": 0, "step": 0}


def test_hang_crash_and_raise_cost_only_their_episode():
    faults = ["none", "hang", "exit", "raise"]
    fns = [functools.partial(Faulty, f) for f in faults]
    with VectorEmbodiedEnv(fns, step_timeout_s=2.0) as venv:
        first_pids = venv.pids
        venv.reset("reach_red", seeds=[0, 1, 2, 3])
        start = time.monotonic()
        obs, rewards, dones, infos = venv.step(np.zeros((4, 1, 2)))
        assert time.monotonic() - start < 15  # one deadline, not ten minutes
        assert [i.get("error") for i in infos] == [None, "timeout", "crash", "step"]
        assert dones.tolist() == [False, True, True, True] and rewards.tolist() == [0] * 4
        assert obs["image"].shape == (4, 16, 16, 3)  # lost episodes repeat their last obs
        assert venv.errors == {"timeout": 1, "crash": 1, "step": 1}
        # the hung and the dead process were replaced; the raising one kept its process
        pids = venv.pids
        assert pids[0] == first_pids[0] and pids[3] == first_pids[3]
        assert pids[1] != first_pids[1] and pids[2] != first_pids[2]
        assert _all_gone(first_pids[1:3])
        # a lost episode stays ended, without another call or count, until reset
        _, _, dones, infos = venv.step(np.zeros((4, 2)))
        assert dones[1:].all() and [i.get("error") for i in infos[1:]] == \
            ["timeout", "crash", "step"]
        assert venv.errors == {"timeout": 1, "crash": 1, "step": 1}
        obs = venv.reset(["reach_blue"] * 4, seeds=[9] * 4)  # the restarted ones work
        assert (obs["image"] == obs["image"][0]).all()
        _, _, dones, infos = venv.step(np.zeros((1, 2)), env_ids=[0])  # a subset steps
        assert "error" not in infos[0] and not dones[0]


def test_close_leaves_no_child_process():
    venv = VectorEmbodiedEnv("reach", num_envs=2, config={"image_size": 16})
    pids = venv.pids
    venv.reset("reach_red", [0, 1])
    venv.close()
    venv.close()  # twice is fine
    assert _all_gone(pids)
    with pytest.raises(RuntimeError, match="closed"):
        venv.reset("reach_red", [0, 1])


def test_bad_names_and_broken_builds_fail_at_start():
    with pytest.raises(ConfigError, match="reach"):
        VectorEmbodiedEnv("no_such_sim", num_envs=2)
    with pytest.raises(EmbodiedEnvError, match="licence"):
        VectorEmbodiedEnv([functools.partial(Faulty, "build")])
