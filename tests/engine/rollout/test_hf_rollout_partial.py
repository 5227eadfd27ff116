"""Partial rollouts in the hf rollout (siirl.engine.rollout.partial_rollout): a pause hook
stops decoding between steps, loads new weights through the engine's ``load_weights`` and
continues the unfinished rows under them, recording the version of every token."""

import pytest
import torch
from test_hf_rollout import EOS, PROMPTS, TOK, config, prompt_batch, tiny_llama

from siirl.data_coordinator.fields import (
    POLICY_VERSION,
    RESPONSE_MASK,
    RESPONSES,
    ROLLOUT_LOG_PROBS,
    TOKEN_POLICY_VERSION,
)
from siirl.engine.models.logprob import response_logprobs
from siirl.engine.rollout.hf_rollout import HFRollout
from siirl_numerics import assert_close, rounding, scale_of, transformer_terms

RESP = 8
GREEDY = {"do_sample": False, "temperature": 0.0}


class Hook:
    """Reports new weights on the ``after``-th calls of ``pending`` (1-based: after that
    many decode steps); each ``swap`` loads the next model of ``models`` (the engine's own
    weights when empty) through ``load_weights``."""

    def __init__(self, after=(), models=(), start=5):
        self.after, self.models, self.current = set(after), list(models), start
        self.engine, self.calls, self.swaps = None, 0, 0

    def pending(self):
        self.calls += 1
        return self.calls in self.after

    def swap(self):
        source = self.models.pop(0) if self.models else self.engine.policy()[0]
        self.engine.load_weights([list(source.state_dict().items())])
        self.swaps += 1
        self.current += 1
        return self.current

    def version(self):
        return self.current


def _rollout(model, hook=None, n=2, **rollout):
    engine = HFRollout(config=config(n=n, resp=RESP, **rollout), module=model, tokenizer=TOK)
    if hook is not None:
        hook.engine = engine
        engine.set_pause_hook(hook)
    return engine


def _generate(model, hook=None, seed=1, validate=False, **rollout):
    torch.manual_seed(seed)  # the rows' noise keys (the batch has no sample_id)
    return _rollout(model, hook, **rollout).generate(prompt_batch(PROMPTS),
                                                     validate=validate).batch


def _lengths(data):
    return data[RESPONSE_MASK].sum(dim=1).long()


def _versions_switch(data, columns_and_versions):
    """The wanted per-token versions: version v from each listed column on, -1 on padding."""
    want = torch.full_like(data[RESPONSES], -1)
    for column, version in columns_and_versions:
        want[:, column:] = version
    return torch.where(data[RESPONSE_MASK].bool(), want, torch.full_like(want, -1))


def test_a_hook_that_never_pauses_changes_nothing_but_adds_the_versions():
    model = tiny_llama()
    knobs = {"calculate_log_probs": True, "max_num_seqs": 4}  # two chunks
    plain = _generate(model, **knobs)
    hook = Hook()
    hooked = _generate(model, hook, **knobs)
    assert hook.calls > 0 and hook.swaps == 0
    for key in plain.keys():
        if isinstance(plain[key], torch.Tensor):
            assert torch.equal(plain[key], hooked[key]), key
    assert TOKEN_POLICY_VERSION not in plain.keys() and POLICY_VERSION not in plain.keys()
    assert torch.equal(hooked[TOKEN_POLICY_VERSION], _versions_switch(hooked, [(0, 5)]))
    assert torch.equal(hooked[POLICY_VERSION], torch.full((6,), 5))


def test_a_pause_that_loads_the_same_weights_keeps_the_greedy_tokens():
    model = tiny_llama()
    plain = _generate(model, **GREEDY)
    k = 3
    hook = Hook(after=[k])
    paused = _generate(model, hook, **GREEDY)
    assert hook.swaps == 1
    assert torch.equal(paused[RESPONSES], plain[RESPONSES])
    assert torch.equal(paused[RESPONSE_MASK], plain[RESPONSE_MASK])
    assert bool((_lengths(paused) > k).any()), "no row was still generating at the pause"
    assert torch.equal(paused[TOKEN_POLICY_VERSION], _versions_switch(paused, [(0, 5), (k, 6)]))
    assert torch.equal(paused[POLICY_VERSION], torch.full((6,), 5))


def test_sampled_rows_keep_their_noise_across_a_pause_and_reruns_repeat():
    model = tiny_llama()
    knobs = {"max_num_seqs": 4}  # the pause comes in the first chunk of two
    plain = _generate(model, **knobs)
    runs = [_generate(model, Hook(after=[2]), **knobs) for _ in range(2)]
    assert bool((_lengths(runs[0])[:4] > 2).any()), "no row was still generating at the pause"
    for run in runs:  # the continuation draws the row's own noise at its token offset
        assert torch.equal(run[RESPONSES], plain[RESPONSES])
    assert torch.equal(runs[0][TOKEN_POLICY_VERSION], runs[1][TOKEN_POLICY_VERSION])
    versions = runs[0][TOKEN_POLICY_VERSION]
    first, second = slice(0, 4), slice(4, 6)
    assert torch.equal(versions[first], _versions_switch(runs[0], [(0, 5), (2, 6)])[first])
    # the second chunk starts after the swap: all of it under the new weights
    assert torch.equal(versions[second], _versions_switch(runs[0], [(0, 6)])[second])
    assert runs[0][POLICY_VERSION].tolist() == [5, 5, 5, 5, 6, 6]


@torch.no_grad()
def _plain_greedy(model, tokens, budget):
    """Greedy tokens after ``tokens`` (one unpadded row, no cache): the yardstick."""
    seq, new = list(tokens), []
    while len(new) < budget and (not new or new[-1] != EOS):
        new.append(int(model(torch.tensor([seq + new])).logits[0, -1].argmax()))
    return new


def test_after_a_swap_the_new_weights_continue_from_prompt_and_prefix():
    models = {5: tiny_llama(0), 6: tiny_llama(1), 7: tiny_llama(2)}
    hook = Hook(after=[2, 4], models=[tiny_llama(1), tiny_llama(2)])
    data = _generate(tiny_llama(0), hook, n=1, **GREEDY)
    assert hook.swaps == 2
    versions, responses = data[TOKEN_POLICY_VERSION], data[RESPONSES]
    lengths = _lengths(data)
    assert int(lengths.max()) > 4, "no row was still generating at the second pause"
    for row, prompt in enumerate(PROMPTS):
        length = int(lengths[row])
        # each run of one version is what that version's weights decode greedily from the
        # prompt and the tokens before it
        start = 0
        while start < length:
            version = int(versions[row, start])
            end = start + int((versions[row, start:length] == version).sum())
            prefix = prompt + responses[row, :start].tolist()
            want = _plain_greedy(models[version], prefix, RESP - start)[:end - start]
            assert responses[row, start:end].tolist() == want, (row, version)
            start = end
        assert versions[row, :length].tolist() == sorted(versions[row, :length].tolist())
    assert data[POLICY_VERSION].tolist() == [5, 5, 5]


def test_rollout_log_probs_are_those_of_the_weights_that_sampled_each_token():
    old, new = tiny_llama(0), tiny_llama(1)
    k, temperature = 3, 0.7
    data = _generate(tiny_llama(0), Hook(after=[k], models=[tiny_llama(1)]),
                     calculate_log_probs=True, temperature=temperature)
    versions, mask = data[TOKEN_POLICY_VERSION], data[RESPONSE_MASK]
    assert bool((versions == 6).any()), "no token was sampled after the swap"
    with torch.no_grad():
        by_version = [response_logprobs(model, data["input_ids"], data["attention_mask"],
                                        data["position_ids"], RESP, temperature=temperature)[0]
                      for model in (old, new)]
    want = torch.where(versions == 6, by_version[1], by_version[0]) * mask
    got = data[ROLLOUT_LOG_PROBS]
    assert torch.equal(got * mask, got)
    positions = data["input_ids"].shape[1]
    assert_close(got, want, rounding(torch.float32, transformer_terms(old.config, positions),
                                     scale_of(want), 1), "stitched vs actor log-probs")


def test_validation_never_pauses_and_the_hook_is_checked_and_cleared():
    model = tiny_llama()
    always = Hook(after=range(1, 1000))
    data = _generate(model, always, validate=True)
    assert always.calls == 0 and TOKEN_POLICY_VERSION not in data.keys()
    engine = _rollout(model, Hook())
    engine.set_pause_hook(None)
    torch.manual_seed(1)
    assert TOKEN_POLICY_VERSION not in engine.generate(prompt_batch(PROMPTS)).batch.keys()
    with pytest.raises(TypeError, match="swap"):
        engine.set_pause_hook(object())


def test_the_plain_loop_pauses_where_the_sampler_does():
    from siirl.engine.rollout.reference import reference_decode
    from siirl.engine.rollout.sampler import decode

    batch = prompt_batch(PROMPTS)
    args = (tiny_llama(), batch["input_ids"], batch["attention_mask"], batch["position_ids"],
            RESP, [EOS], 0, False, 0.8, -1, 1.0, torch.arange(3, dtype=torch.long) * 7919)
    got = [fn(*args, with_log_probs=True, first_draw=4, pause=Hook(after=[3]).pending)
           for fn in (decode, reference_decode)]
    assert got[0].tokens.shape[1] == 3 and bool(got[0].unfinished.any())
    for field in ("tokens", "log_probs", "unfinished"):
        assert torch.equal(getattr(got[0], field), getattr(got[1], field)), field
