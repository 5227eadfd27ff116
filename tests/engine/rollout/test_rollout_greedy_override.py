"""RolloutBase.overridden(greedy=True): the ReMax baseline's greedy reply, whatever the
config samples with, kept through a nested override (a multi-turn turn inside it)."""

import torch
from test_hf_rollout import PROMPTS, TOK, config, prompt_batch, tiny_llama

from siirl.engine.rollout.hf_rollout import HFRollout


def test_greedy_override_plays_the_greedy_reply_once_per_prompt():
    model = tiny_llama()
    sampled = HFRollout(config=config(n=4, resp=6, temperature=1.0), module=model,
                        tokenizer=TOK)
    greedy = HFRollout(config=config(n=1, resp=6, do_sample=False), module=model, tokenizer=TOK)
    with sampled.overridden(n=1, greedy=True):
        params = sampled.sampling(validate=False)
        out = sampled.generate(prompt_batch(PROMPTS)).batch
    assert params["greedy"] and params["n"] == 1
    assert out.batch_size == torch.Size([len(PROMPTS)])
    assert torch.equal(out["responses"], greedy.generate(prompt_batch(PROMPTS)).batch["responses"])
    assert not sampled.sampling(validate=False)["greedy"]  # the block is over
    assert sampled.sampling(validate=False)["n"] == 4


def test_a_nested_override_keeps_the_outer_greedy_setting():
    engine = HFRollout(config=config(n=4, resp=6), module=tiny_llama(), tokenizer=TOK)
    with engine.overridden(greedy=True):
        with engine.overridden(n=1, response_length=3):
            inner = engine.sampling(validate=False)
            assert engine.max_response_length() == 3
        outer = engine.sampling(validate=False)
    assert inner["greedy"] and inner["n"] == 1
    assert outer["greedy"] and outer["n"] == 4 and engine.max_response_length() == 6


def test_val_sampled_switches_validation_decoding_only():
    # val_kwargs greedy: the sampled pass samples at the training rollout's temperature
    engine = HFRollout(config=config(n=4, resp=6, temperature=0.8), module=tiny_llama(),
                       tokenizer=TOK)
    assert engine.sampling(validate=True)["greedy"]
    with engine.overridden(val_sampled=True):
        sampled = engine.sampling(validate=True)
        training = engine.sampling(validate=False)
    assert not sampled["greedy"] and sampled["temperature"] == 0.8 and sampled["n"] == 1
    assert training == engine.sampling(validate=False)  # training's decoding is untouched
    # val_kwargs sample at their own temperature: kept for the sampled pass, off for greedy
    engine = HFRollout(config=config(n=4, resp=6, val_kwargs={
        "n": 2, "do_sample": True, "temperature": 0.5}), module=tiny_llama(), tokenizer=TOK)
    with engine.overridden(val_sampled=True):
        assert engine.sampling(validate=True)["temperature"] == 0.5
    with engine.overridden(val_sampled=False):
        greedy = engine.sampling(validate=True)
    assert greedy["greedy"] and greedy["n"] == 2
