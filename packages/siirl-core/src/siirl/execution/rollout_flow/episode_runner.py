"""The episode runner: which episodes are in play, and the order of their turns.

Every episode loop (agentic text games, embodied chunks, multi-turn tool calls, multi-agent
turns) is the same schedule: start episodes into environment slots, then turn after turn,
make one batched policy call for the episodes still playing (``act``: the loop's own
observation formatting and reply parsing, returning the actions to run; a multi-agent turn
plays all its agents here), run those actions together
(``step``: environments, in worker processes or not, or tools), and hand each episode its
result (``observe``: the loop's own reward and next observation). An episode says it has
ended by its ``done``.

Two ways to fill the slots:

* ``waves=False`` (ROLL's rollout scheduler): at most ``max_in_flight`` episodes at once
  (0: all); a new episode starts as soon as one ends, so at most that many environments
  exist; ``finished(episode)`` is called as each ends (and for those still in play when a
  turn raises). Each episode ends by itself (its own turn limit sets ``done``). With
  ``peers`` (an all-gather over the workers whose rollout calls must pair up: FSDP-sharded
  weights are gathered once per call) the workers go turn for turn until none has an
  episode left, and one with nothing to play that turn calls ``idle([])`` instead.
* ``waves=True`` (a vector of ``max_in_flight`` environments): episodes start a wave at a
  time into slots ``0..wave-1``; a wave plays ``max_turns`` turns (or until all ended), and
  ``idle(wave)`` is called for each turn left once all have ended (workers whose rollout
  calls must pair up keep calling), then ``finished`` for each of the wave's episodes.

The runner owns no environment and no model; it decides the order, so every loop steps
its environments and calls its model in the same order for the same seeds. It lives in
core because the multi-agent rollout (``siirl.dag_worker.multi_agent``) plays on it too and
core never imports siirl-envs; the environment loops reach it through
``siirl.environment.episodes``.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

# start(indices, slots) -> the started episodes (their environments reset), in that order
Start = Callable[[List[int], List[int]], List[Any]]
# act(playing episodes, their slots, turn) -> (episode, action) pairs to run this turn
Act = Callable[[List[Any], List[int], int], Optional[List[Tuple[Any, Any]]]]


class EpisodeRunner:
    def __init__(self, max_in_flight: int = 0, waves: bool = False,
                 max_turns: Optional[int] = None):
        self.max_in_flight = int(max_in_flight or 0)
        self.waves = bool(waves)
        self.max_turns = None if max_turns is None else int(max_turns)
        if self.max_turns is not None and not self.waves:
            raise ValueError("max_turns bounds a wave; scheduled episodes end by themselves "
                             "(their own turn limit)")

    def run(self, count: int, start: Start, act: Act,
            step: Optional[Callable[[List[Any], List[Any], List[int]], List[Any]]] = None,
            observe: Optional[Callable[[Any, Any], None]] = None,
            finished: Optional[Callable[[Any], None]] = None,
            idle: Optional[Callable[[List[Any]], None]] = None,
            peers: Optional[Callable[[Any], List[Any]]] = None) -> List[Any]:
        """Play ``count`` episodes; they are returned in index order.

        ``step(episodes, actions, slots)`` runs the actions ``act`` returned, one result
        per action, and ``observe(episode, result)`` records each; without ``step``,
        ``act`` plays the whole turn itself."""
        play = _Turn(act, step, observe)
        if self.waves:
            return self._waves(count, start, play, finished, idle)
        if (peers is None) != (idle is None):
            raise ValueError("scheduled episodes keep in step with peers only given both "
                             "peers and idle")
        return self._scheduled(count, start, play, finished, idle, peers)

    def _scheduled(self, count: int, start: Start, play: _Turn,
                   finished: Optional[Callable[[Any], None]],
                   idle: Optional[Callable[[List[Any]], None]] = None,
                   peers: Optional[Callable[[Any], List[Any]]] = None) -> List[Any]:
        pending = list(range(count))
        free = list(range(self.max_in_flight or count))  # environment slots not in use
        ended: dict = {}
        active: List[tuple] = []  # (index, slot, episode), in start order
        turn = 0
        try:
            while pending or active or peers is not None:
                while pending and (self.max_in_flight <= 0 or len(active) < self.max_in_flight):
                    index, slot = pending.pop(0), free.pop(0)
                    active.append((index, slot, start([index], [slot])[0]))
                live = [(slot, e) for _, slot, e in active if not e.done]
                if peers is not None:  # one gather a turn: (playing now, anything left)
                    states = peers((bool(live), bool(pending or active)))
                    if not any(left for _, left in states):
                        break
                    if not live and any(playing for playing, _ in states):
                        idle([])  # a peer plays this turn: pair its rollout call
                if live:
                    play([e for _, e in live], [slot for slot, _ in live], turn)
                    turn += 1
                for item in [item for item in active if item[2].done]:
                    ended[item[0]] = item[2]
                    active.remove(item)
                    free.append(item[1])
                    if finished is not None:
                        finished(item[2])
        finally:  # a failure mid-way still lets the caller release what is in flight
            for _, _, episode in active:
                if finished is not None:
                    finished(episode)
        return [ended[i] for i in range(count)]

    def _waves(self, count: int, start: Start, play: _Turn,
               finished: Optional[Callable[[Any], None]],
               idle: Optional[Callable[[List[Any]], None]]) -> List[Any]:
        wave_size = self.max_in_flight or max(count, 1)
        episodes: List[Any] = []
        for first in range(0, count, wave_size):
            indices = list(range(first, min(first + wave_size, count)))
            slots = list(range(len(indices)))
            wave: List[Any] = []
            try:
                wave = start(indices, slots)
                episodes += wave
                turn = 0
                while self.max_turns is None or turn < self.max_turns:
                    live = [j for j in slots if not wave[j].done]
                    if not live:
                        if idle is None:
                            break
                        idle(wave)
                    else:
                        play([wave[j] for j in live], live, turn)
                    turn += 1
            finally:
                for episode in wave:
                    if finished is not None:
                        finished(episode)
        return episodes


class _Turn:
    """One turn: the policy's actions, run together, each result back to its episode."""

    def __init__(self, act: Act, step: Any, observe: Any):
        self.act, self.step, self.observe = act, step, observe

    def __call__(self, live: List[Any], slots: List[int], turn: int) -> None:
        acting = self.act(live, slots, turn)
        if self.step is None or not acting:
            return
        slot_of = {id(e): s for e, s in zip(live, slots, strict=True)}
        episodes = [e for e, _ in acting]
        results = self.step(episodes, [a for _, a in acting], [slot_of[id(e)] for e in episodes])
        for episode, result in zip(episodes, results, strict=True):
            self.observe(episode, result)
