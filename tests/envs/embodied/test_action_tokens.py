"""OpenVLA-style action tokens: 256 bins per dimension on the last token ids, chunks,
and the policy's distribution restricted to them for sampling and log-probs."""

import numpy as np
import pytest
import torch

from siirl.environment.embodied.action_tokens import ActionTokenizer
from siirl.errors import ConfigError


def test_bins_are_the_last_token_ids_and_round_trip_within_half_a_bin():
    tok = ActionTokenizer(vocab_size=1000, bins=256)
    assert tok.first_id == 744
    assert tok.encode(np.array([-1.0, 1.0])).tolist() == [999, 744]  # the two ends
    values = np.random.default_rng(0).uniform(-1, 1, size=(5, 7))
    back = tok.decode(tok.encode(values))
    assert back.dtype == np.float32 and np.abs(back - values).max() <= 1 / 256 + 1e-7
    assert tok.encode(np.array([3.0, -7.0])).tolist() == [744, 999]  # clipped


def test_a_chunk_is_k_actions_of_d_dimensions():
    tok = ActionTokenizer(vocab_size=300, bins=256)
    chunk = np.linspace(-0.9, 0.9, 14).reshape(2, 7)
    assert np.allclose(tok.chunk(tok.encode(chunk).ravel(), 7), chunk, atol=1 / 256)
    with pytest.raises(ValueError, match="whole actions of 7"):
        tok.chunk(tok.encode(chunk).ravel()[:13], 7)
    with pytest.raises(ValueError, match="not an action token"):
        tok.decode(np.array([5]))


def test_a_vocabulary_too_small_for_the_bins_fails_at_start():
    with pytest.raises(ConfigError, match="cannot hold 256 action bins after its 64 reserved"):
        ActionTokenizer(vocab_size=300, bins=256, reserved=64)


def test_sampling_and_log_probs_stay_on_action_tokens():
    tok = ActionTokenizer(vocab_size=40, bins=8)
    logits = torch.randn(3, 5, 40, generator=torch.Generator().manual_seed(0))
    logits[..., :32] += 100.0  # the language tokens are far likelier: never drawn
    drawn = tok.sample(logits, temperature=1.0, generator=torch.Generator().manual_seed(1))
    assert drawn.shape == (3, 5) and bool((drawn >= 32).all())
    greedy = tok.sample(logits, temperature=0.0)
    assert torch.equal(greedy, logits[..., 32:].argmax(-1) + 32)
    every = torch.arange(32, 40).expand(3, 5, 8)
    total = tok.log_probs(logits.unsqueeze(-2).expand(3, 5, 8, 40), every).exp().sum(-1)
    assert torch.allclose(total, torch.ones(3, 5), atol=1e-5)  # a distribution over bins
    hot = tok.log_probs(logits, drawn, temperature=0.5)
    assert hot.shape == (3, 5) and bool((hot <= 0).all())


def test_log_probs_carry_gradients_to_the_logits():
    tok = ActionTokenizer(vocab_size=16, bins=4)
    logits = torch.zeros(2, 16, requires_grad=True)
    tok.log_probs(logits, torch.tensor([12, 15])).sum().backward()
    assert logits.grad[:, :12].abs().sum() == 0 and logits.grad[:, 12:].abs().sum() > 0
