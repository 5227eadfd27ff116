"""The hf rollout's ``rollout_log_probs``: each sampled token's log-prob under the sampling
distribution (logits / temperature), reported when ``rollout.calculate_log_probs`` or rollout
correction asks for it; the rollout is unchanged otherwise."""

import pytest
import torch
from test_hf_rollout import PROMPTS, TOK, config, prompt_batch, tiny_llama

from siirl.engine.models.logprob import response_logprobs
from siirl.engine.rollout.hf_rollout import HFRollout
from siirl.engine.rollout.reference import reference_decode
from siirl.engine.rollout.sampler import decode
from siirl_numerics import assert_close, rounding, scale_of, transformer_terms

RESP = 6


def _generate(model, validate=False, **extra):
    cfg = config(n=2, resp=RESP, **extra.pop("rollout", {}))
    cfg.update(extra)
    return HFRollout(config=cfg, module=model, tokenizer=TOK).generate(
        prompt_batch(PROMPTS), validate=validate).batch


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_log_probs_are_the_actors_log_probs_of_the_sampled_tokens(temperature):
    model = tiny_llama()
    data = _generate(model, rollout={"calculate_log_probs": True, "temperature": temperature})
    mask = data["response_mask"]
    got = data["rollout_log_probs"]
    assert got.dtype == torch.float32 and got.shape == mask.shape
    assert torch.equal(got * mask, got)  # 0 on padding
    assert bool((got[mask.bool()] < 0).all())
    with torch.no_grad():
        want, _ = response_logprobs(model, data["input_ids"], data["attention_mask"],
                                    data["position_ids"], RESP, temperature=temperature)
    want = want * mask
    # the KV-cached decode and the one padded forward: the same sums in another order
    positions = data["input_ids"].shape[1]
    assert_close(got, want, rounding(torch.float32, transformer_terms(model.config, positions),
                                     scale_of(want), 1), "rollout vs actor log-probs")


def test_rollout_correction_asks_for_them_too():
    data = _generate(tiny_llama(), algorithm={"rollout_correction": {"rollout_is": "token"}})
    assert "rollout_log_probs" in data.keys()


def test_without_the_key_and_in_validation_nothing_changes():
    model = tiny_llama()
    torch.manual_seed(1)  # the rows' noise keys (the batch has no sample_id)
    plain = _generate(model)
    assert "rollout_log_probs" not in plain.keys()
    torch.manual_seed(1)
    with_lp = _generate(model, rollout={"calculate_log_probs": True})
    tensors = [key for key in plain.keys() if isinstance(plain[key], torch.Tensor)]
    assert "responses" in tensors
    for key in tensors:  # the same tokens: the log-probs are read, not sampled
        assert torch.equal(plain[key], with_lp[key]), key
    greedy = _generate(model, validate=True, rollout={"calculate_log_probs": True})
    assert "rollout_log_probs" not in greedy.keys()


def test_the_plain_loop_reports_the_same_log_probs():
    model = tiny_llama()
    batch = prompt_batch(PROMPTS)
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    keys = torch.arange(3, dtype=torch.long) * 7919
    args = (model, ids, mask, pos, RESP, [2], 0, False, 0.8, -1, 1.0, keys)
    tokens, log_probs = decode(*args, with_log_probs=True)
    ref_tokens, ref_log_probs = reference_decode(*args, with_log_probs=True)
    assert torch.equal(tokens, ref_tokens)
    assert torch.equal(log_probs, ref_log_probs)
