"""Partial rollouts through a ``vllm serve`` process (``async_training.partial_rollout``
with ``rollout.mode=server``): sampling that stops when new weights wait, loads them and
goes on with the unfinished responses under them.

Each prompt's request streams its samples' tokens back as they are made. Between chunks
the caller's ``pending()`` is asked; on True no further request is sent and every request
in flight is aborted (``POST /abort_requests``, again until each stream has ended: a
request that reached the server after an abort is caught by the next). With no request
left in the server, ``swap()`` loads the new weights; then each unfinished sample is sent
again as a request of its own, its prompt followed by its tokens so far (prefilled under
the new weights) with the token budget that is left, and requests never sent go as they
were. Each token records the version of the weights that made it, and its log-prob is
under those weights.

A continued sample's seed is its request's seed mixed with its place in the group and its
token count, so the same pause points give the same tokens.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Tuple

DONE_REASONS = ("stop", "length")  # an aborted choice ends with "abort"
POLL_S = 0.01
MAX_STREAMS = 64
_SEED_BITS = (1 << 63) - 1


@dataclass
class Sample:
    """One response: its prompt, its request's fields, what it has so far."""

    prompt: List[int]
    fields: Dict[str, Any]
    place: int  # its index among its prompt's samples
    tokens: List[int] = field(default_factory=list)
    log_probs: List[float] = field(default_factory=list)
    versions: List[int] = field(default_factory=list)
    done: bool = False


@dataclass
class Job:
    """One request: its prompt and fields; its choices fill ``samples`` in order."""

    prompt: List[int]
    fields: Dict[str, Any]
    samples: List[int]


def continuation(sample: Sample, index: int, width: int) -> Job:
    """The request that goes on with ``sample`` (number ``index``) after its tokens."""
    fields = dict(sample.fields, n=1, max_tokens=width - len(sample.tokens))
    if "seed" in fields:
        fields["seed"] = hash((int(fields["seed"]), sample.place, len(sample.tokens))) \
            & _SEED_BITS
    return Job(sample.prompt + sample.tokens, fields, [index])


class PausableRound:
    """One round of requests under one weight version; ``run`` -> whether it paused."""

    def __init__(self, server: Any, path: str, body: Callable[[Job], dict],
                 samples: List[Sample], version: int):
        self.server, self.path, self.body = server, path, body
        self.samples, self.version = samples, version
        self._lock = threading.Lock()
        self._pausing = False
        self.unsent: List[Job] = []

    def _stream(self, job: Job) -> None:
        with self._lock:
            if self._pausing:
                self.unsent.append(job)
                return
        ended = set()
        for chunk in self.server.stream(self.path, self.body(job)):
            for choice in chunk.get("choices", ()):
                sample = self.samples[job.samples[int(choice["index"])]]
                ids = [int(t) for t in choice.get("token_ids") or ()]
                values = (choice.get("logprobs") or {}).get("token_logprobs") or []
                sample.tokens += ids
                sample.log_probs += [float(v) for v in values][:len(ids)]
                sample.versions += [self.version] * len(ids)
                reason = choice.get("finish_reason")
                if reason is not None:
                    ended.add(int(choice["index"]))
                    sample.done = reason in DONE_REASONS
        if len(ended) != len(job.samples) and not self._pausing:  # else: aborted by us
            raise self.server.error(f"the rollout's {self.server.label} server ended a "
                                    f"stream of {self.path} before every sample finished")

    def run(self, jobs: List[Job], pending: Callable[[], bool]) -> bool:
        paused = False
        with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), MAX_STREAMS))) as pool:
            futures = [pool.submit(self._stream, job) for job in jobs]
            while True:
                _, running = wait(futures, timeout=POLL_S)
                if not running:
                    break
                if not paused and pending():
                    with self._lock:
                        self._pausing = paused = True
                if paused:  # until every stream in flight has ended
                    self.server.post("/abort_requests", {})
            for future in futures:
                future.result()  # a stream's error, here
        return paused


def sample_with_pauses(server: Any, path: str, body: Callable[[Job], dict],
                       prompts: List[List[int]], requests: List[Dict[str, Any]], width: int,
                       hook: Any, after_swap: Callable[[], None]
                       ) -> List[Tuple[List[int], List[float], List[int]]]:
    """``[(token ids, their log-probs, their versions)]`` of every prompt's samples, in
    order; ``hook``: ``partial_rollout.PauseHook``; ``after_swap()`` runs after each swap
    (the rollout wakes its engine again)."""
    samples: List[Sample] = []
    jobs: List[Job] = []
    for prompt, fields in zip(prompts, requests, strict=True):
        first = len(samples)
        samples += [Sample(list(prompt), dict(fields), place) for place in range(fields["n"])]
        jobs.append(Job(list(prompt), dict(fields), list(range(first, len(samples)))))
    while jobs:
        round_ = PausableRound(server, path, body, samples, int(hook.version()))
        if not round_.run(jobs, hook.pending):
            break
        unsent = {id(job) for job in round_.unsent}
        jobs = list(round_.unsent) + [
            continuation(samples[i], i, width) for job in jobs if id(job) not in unsent
            for i in job.samples if not samples[i].done]
        hook.swap()
        after_swap()
    return [(s.tokens, s.log_probs, s.versions) for s in samples]
