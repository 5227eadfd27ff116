"""The shared episode runner, environment registry and process pool: a toy text
environment registered through the registry plays episodes through the runner (in process
and in the pool's worker processes), and the runner's two schedules keep their order."""

import time

import pytest
from test_trajectory_manager import char_tokenizer

from siirl.environment.agentic import TrajectoryEnvManager
from siirl.environment.agentic.env_workers import EnvWorkerPool
from siirl.environment.base import TextEnv
from siirl.environment.episodes import EpisodeRunner, episode_key, episode_seed
from siirl.environment.episodes.pool import EnvProcessPool
from siirl.environment.registry import make_env
from siirl.errors import ConfigError
from siirl.plugins import register, unregister


class CountTo(TextEnv):
    """Say the numbers up to ``target``, one per turn: the docs' "Add an environment"."""

    instructions = "Count: reply <answer>n</answer> with the next number."

    def __init__(self, target: int = 3):
        self.target, self.count = int(target), 0

    def reset(self, seed=None):
        self.count = int(seed or 0) % 2  # the seed picks where counting starts
        return f"Start after {self.count}."

    def step(self, action):
        right = action == str(self.count + 1)
        self.count += int(right)
        done = self.count >= self.target
        return f"Now {self.count}.", 1.0 if right else -0.5, done, {"success": done}


@pytest.fixture
def count_to():
    register("siirl.environments", "count_to")(CountTo)
    yield "count_to"
    unregister("siirl.environments", "count_to")


def counting_policy(tokenizer, calls):
    """Replies with the number after the last one in the prompt's text."""
    def policy(prompts):
        calls.append(len(prompts))
        replies = []
        for ids in prompts:
            text = tokenizer.decode(ids, skip_special_tokens=True)
            last = max(int(ch) for ch in text if ch.isdigit())
            replies.append(tokenizer.encode(f"<answer>{last + 1}</answer>",
                                            add_special_tokens=False))
        return replies
    return policy


def play(manager, starts, in_flight=0):
    calls, ended = [], []
    episodes = manager.run_scheduled(starts, counting_policy(manager.tokenizer, calls),
                                     in_flight, ended.append)
    return episodes, calls, ended


def test_a_registered_toy_environment_plays_through_the_runner(count_to):
    with pytest.raises(ConfigError, match="no setting 'goal'.*target"):
        make_env(count_to, {"goal": 3})
    manager = TrajectoryEnvManager(char_tokenizer(chat=False), max_actions_per_traj=5)
    seeds = [episode_seed(7, sample_id, 0) for sample_id in range(4)]
    starts = [lambda s=s, k=k: manager.start(make_env(count_to, {"target": 3}), s, "g",
                                             key=k)
              for k, s in enumerate(seeds)]
    episodes, calls, ended = play(manager, starts, in_flight=2)
    assert [e.seed for e in episodes] == seeds  # returned in start order
    assert all(e.done and e.success for e in episodes)
    # each episode counts from its seed's start to 3: one turn per number
    assert [e.turns for e in episodes] == [3 - s % 2 for s in seeds]
    assert max(calls) == 2 and sum(calls) == sum(e.turns for e in episodes)
    assert sorted(id(e) for e in ended) == sorted(id(e) for e in episodes)
    assert manager.metrics(episodes)["env/success_rate"] == 1.0


def test_the_toy_environment_in_worker_processes_plays_the_same_episodes(count_to):
    manager = TrajectoryEnvManager(char_tokenizer(chat=False), max_actions_per_traj=5)
    local, _, _ = play(manager, [lambda s=s: manager.start(CountTo(3), s, "g")
                                 for s in range(3)])
    pool = EnvWorkerPool(processes=2, step_timeout_s=30.0)
    try:
        # a class travels to the processes by its import path (an in-process register
        # does not): the pool builds it there, the parent keeps a copy for action parsing
        remote, _, _ = play(manager, [lambda s=s: manager.start(
            pool.create(CountTo, {"target": 3}, None), s, "g") for s in range(3)])
    finally:
        pool.close()
    assert [(e.ids, e.mask, e.reward) for e in remote] == \
        [(e.ids, e.mask, e.reward) for e in local]


class Slot:
    def __init__(self, index, turns):
        self.index, self.turns, self.done, self.played = index, turns, False, 0


def test_scheduled_episodes_start_as_slots_free_and_are_released_on_failure():
    lengths = [3, 1, 2, 1]
    order, released = [], []

    def act(live, slots, turn):
        order.append([(e.index, s) for e, s in zip(live, slots, strict=True)])
        for e in live:
            e.played += 1
            e.done = e.played >= e.turns

    runner = EpisodeRunner(max_in_flight=2)
    out = runner.run(4, lambda idx, slots: [Slot(i, lengths[i]) for i in idx], act,
                     finished=lambda e: released.append(e.index))
    assert [e.index for e in out] == [0, 1, 2, 3]
    # episode 1 ends after one turn; episode 2 takes its slot (1) on the next turn
    assert order == [[(0, 0), (1, 1)], [(0, 0), (2, 1)], [(0, 0), (2, 1)], [(3, 0)]]
    assert released == [1, 0, 2, 3]

    def failing(live, slots, turn):
        raise RuntimeError("policy failed")

    released.clear()
    with pytest.raises(RuntimeError, match="policy failed"):
        runner.run(4, lambda idx, slots: [Slot(i, 2) for i in idx], failing,
                   finished=lambda e: released.append(e.index))
    assert released == [0, 1]  # what was in play is still released


def test_waves_play_a_fixed_number_of_turns_and_idle_once_all_ended():
    lengths = [1, 2, 5]
    steps, idles = [], []

    def act(live, slots, turn):
        return [(e, f"a{turn}") for e in live]

    def step(episodes, actions, slots):
        steps.append(list(zip(slots, actions, strict=True)))
        return [None] * len(episodes)

    def observe(episode, _):
        episode.played += 1
        episode.done = episode.played >= episode.turns

    runner = EpisodeRunner(max_in_flight=2, waves=True, max_turns=3)
    out = runner.run(3, lambda idx, slots: [Slot(i, lengths[i]) for i in idx], act,
                     step=step, observe=observe, idle=lambda wave: idles.append(len(wave)))
    # wave 1 (slots 0, 1): episode 0 ends after turn 0, 1 after turn 1, then one idle turn;
    # wave 2 (slot 0): episode 2 is cut at max_turns, not done
    assert steps == [[(0, "a0"), (1, "a0")], [(1, "a1")], [(0, "a0")], [(0, "a1")],
                     [(0, "a2")]]
    assert idles == [2]
    assert [e.played for e in out] == [1, 2, 3] and not out[2].done
    with pytest.raises(ValueError, match="max_turns"):
        EpisodeRunner(max_turns=3)


class Sleepy:
    def nap(self, seconds):
        time.sleep(seconds)
        return seconds

    def fail(self):
        raise KeyError("nothing here")


def test_the_pool_contains_errors_and_restarts_a_process_past_its_deadline():
    pool = EnvProcessPool([Sleepy, Sleepy], step_timeout_s=1.0, start_timeout_s=60.0)
    try:
        first = pool.pids
        assert pool.call_many([(0, 0, "nap", (0,)), (1, 0, "nap", (0,))]) == \
            [("ok", 0), ("ok", 0)]
        replies = pool.call_many([(0, 0, "nap", (30,)), (1, 0, "fail", ())])
        assert replies[0] == ("timeout", None)
        assert replies[1][0] == "error" and "KeyError" in replies[1][1][0]
        assert pool.pids[0] != first[0] and pool.pids[1] == first[1]
        assert pool.call_many([(0, 0, "nap", (0,))]) == [("ok", 0)]  # rebuilt by its factory
    finally:
        pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.call_many([(0, 0, "nap", (0,))])


def test_episode_keys_are_distinct_per_sample():
    keys = {episode_key(sample, 4, k) for sample in range(5) for k in range(4)}
    assert len(keys) == 20


def test_scheduled_workers_keep_in_step_until_none_has_an_episode_left():
    """Two workers (threads) whose episodes end on different turns: each makes a policy
    call, or an idle one, on every turn either plays, so collective rollout calls pair."""
    import threading

    barrier = threading.Barrier(2)
    states = [None, None]

    def gather(rank):
        def peers(state):
            states[rank] = state
            barrier.wait()
            seen = list(states)
            barrier.wait()  # all have read before the next turn writes
            return seen
        return peers

    calls = {0: [], 1: []}

    def worker(rank, lengths):
        def act(live, slots, turn):
            calls[rank].append("play")
            for e in live:
                e.played += 1
                e.done = e.played >= e.turns

        EpisodeRunner(max_in_flight=1).run(
            len(lengths), lambda idx, slots: [Slot(i, lengths[i]) for i in idx], act,
            idle=lambda _: calls[rank].append("idle"), peers=gather(rank))

    threads = [threading.Thread(target=worker, args=(0, [1, 1])),
               threading.Thread(target=worker, args=(1, [3, 2]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert calls[1] == ["play"] * 5
    assert calls[0] == ["play"] * 2 + ["idle"] * 3  # as many calls as its peer
    with pytest.raises(ValueError, match="both"):
        EpisodeRunner().run(1, lambda idx, slots: [Slot(0, 1)], lambda *a: None,
                            peers=lambda s: [s])
