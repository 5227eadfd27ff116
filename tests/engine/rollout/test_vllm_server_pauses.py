"""Partial rollouts through a real ``vllm serve`` process on the CPU (``server_pauses``):
a call that pauses for new weights goes on with its unfinished samples under them, each
token recording the version that made it; with the same weights swapped in, greedy
samples come out as without a pause (the continuation prefills prompt + tokens so far)."""

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (tools/setup.sh --vllm)")

from test_vllm_rollout import TEXTS, prompts  # noqa: E402
from test_vllm_server import run_config, server_pids, sync  # noqa: E402

from siirl.data_coordinator.fields import POLICY_VERSION, TOKEN_POLICY_VERSION  # noqa: E402
from siirl.engine.fsdp.engines import fsdp_actor  # noqa: E402
from siirl.engine.rollout.vllm_rollout import VLLMRollout  # noqa: E402

pytestmark = pytest.mark.vllm
WIDTH = 48


class SwapOnce:
    """Pending once the call's first tokens have streamed back (so the pause comes mid-call
    whatever the machine's speed); the swap re-syncs the actor's weights."""

    def __init__(self, actor, rollout, monkeypatch):
        self.actor, self.rollout = actor, rollout
        self.loaded, self.swaps, self.streamed = 0, 0, False
        server = rollout.llm.server
        stream = server.stream

        def watched(path, body, **kwargs):
            for chunk in stream(path, body, **kwargs):
                if any(choice.get("token_ids") for choice in chunk.get("choices", ())):
                    self.streamed = True
                yield chunk

        monkeypatch.setattr(server, "stream", watched)

    def pending(self):
        return self.swaps == 0 and self.streamed

    def swap(self):
        sync(self.actor, self.rollout)
        self.swaps += 1
        self.loaded += 1
        return self.loaded

    def version(self):
        return self.loaded


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    config = run_config(tmp_path_factory.mktemp("pauses"), f"data.max_response_length={WIDTH}",
                        "actor_rollout_ref.rollout.ignore_eos=true",
                        "actor_rollout_ref.rollout.n=4")
    actor = fsdp_actor(config)
    rollout = VLLMRollout(config=config, peers={"actor": actor})
    sync(actor, rollout)
    yield actor, rollout
    rollout.close()
    assert server_pids(rollout.llm.server.log_path) == []


def _greedy(count):  # vLLM takes greedy requests one sample each
    return [dict(n=1, max_tokens=WIDTH, logprobs=0, ignore_eos=True, temperature=0.0)
            for _ in range(count)]


def test_a_paused_greedy_call_gives_the_tokens_of_an_uninterrupted_one(served, monkeypatch):
    actor, rollout = served
    ids = [actor.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS] * 4
    want = rollout.llm.sample(ids, _greedy(len(ids)))
    hook = SwapOnce(actor, rollout, monkeypatch)
    got = rollout.llm.sample_with_pauses(ids, _greedy(len(ids)), WIDTH, hook, lambda: None)
    assert hook.swaps == 1
    assert len(got) == len(want) == len(ids)
    spanned = 0
    for (tokens, log_probs, versions), (want_tokens, want_log_probs) in zip(got, want,
                                                                            strict=True):
        assert tokens == want_tokens  # fp32: the second prefill rounds like decoding
        assert len(log_probs) == len(versions) == WIDTH
        assert versions == sorted(versions) and set(versions) <= {0, 1}
        spanned += len(set(versions)) == 2
        # fp32 log-probs of a prefill against incremental decoding
        assert max(abs(a - b) for a, b in zip(log_probs, want_log_probs, strict=True)) < 1e-3
    assert spanned > 0  # the pause came mid-call: some samples went on under version 1


def test_a_training_generate_records_each_tokens_version(served, monkeypatch):
    actor, rollout = served
    hook = SwapOnce(actor, rollout, monkeypatch)
    rollout.set_pause_hook(hook)
    try:
        batch = rollout.generate(prompts(actor.tokenizer, TEXTS)).batch  # sampled
    finally:
        rollout.set_pause_hook(None)
    assert hook.swaps == 1
    per_token, oldest = batch[TOKEN_POLICY_VERSION], batch[POLICY_VERSION]
    mask = batch["response_mask"].bool()
    assert per_token.shape == batch["responses"].shape
    assert bool((per_token[~mask] == -1).all()) and bool((per_token[mask] >= 0).all())
    assert torch.equal(oldest, torch.where(mask, per_token, 99).amin(dim=1))
    assert int(per_token.max()) == 1
