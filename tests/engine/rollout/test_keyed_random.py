"""Counter-based per-row randomness for the rollout: deterministic, independent, uniform."""

import torch

from siirl.engine.rollout.keyed_random import row_keys, uniforms


def test_same_key_same_draw_same_number_whatever_the_batch():
    keys = row_keys(7, torch.arange(100))
    alone = torch.stack([uniforms(keys[i:i + 1], 3)[0] for i in (5, 42, 99)])
    assert torch.equal(uniforms(keys, 3)[[5, 42, 99]], alone)
    assert not torch.equal(uniforms(keys, 3), uniforms(keys, 4))  # draws differ
    assert not torch.equal(keys, row_keys(8, torch.arange(100)))  # seeds differ
    assert not torch.equal(keys, row_keys(7, torch.arange(100), 1))  # salts differ


def test_uniforms_look_uniform_and_uncorrelated():
    u = uniforms(row_keys(1, torch.arange(200_000)), 0)
    assert u.dtype == torch.float64 and 0.0 <= u.min() and u.max() < 1.0
    assert abs(u.mean().item() - 0.5) < 0.005
    assert abs(u.var().item() - 1 / 12) < 0.002
    counts = torch.histc(u.float(), bins=10, min=0, max=1)
    assert (counts - 20_000).abs().max() < 1_000  # about 7 standard deviations
    v = uniforms(row_keys(1, torch.arange(200_000)), 1)
    assert abs(torch.corrcoef(torch.stack([u, v]))[0, 1].item()) < 0.01
    neighbours = torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1].item()
    assert abs(neighbours) < 0.01  # consecutive row ids give unrelated numbers
