"""The shared tolerance helper: derived bounds, and failures that say the worst
difference, where, and the tolerance used."""

import pytest
import torch

from siirl_numerics import (
    assert_adam_step_close,
    assert_close,
    rounding,
    transformer_terms,
)


def _adam_step(weight, grad, lr=0.01, eps=1e-8):
    param = torch.nn.Parameter(weight.clone())
    param.grad = grad.clone()
    optimizer = torch.optim.AdamW([param], lr=lr, eps=eps, weight_decay=0.0)
    optimizer.step()
    return param.detach()


def test_rounding_bound_grows_with_terms_and_dtype_and_holds_for_reordered_sums():
    small, large = rounding(torch.float32, 64), rounding(torch.float32, 4096)
    assert small.rtol < large.rtol < 1e-4
    assert rounding(torch.bfloat16, 64).rtol > 1000 * small.rtol
    generator = torch.Generator().manual_seed(0)
    terms = torch.randn(256, 4096, generator=generator)
    forward, backward = terms.sum(dim=1), terms.flip(1).cumsum(dim=1)[:, -1]
    assert_close(forward, backward, rounding(torch.float32, 4096, float(terms.abs().max()),
                                             256), "reordered sums")


def test_a_difference_beyond_the_bound_reports_worst_element_and_tolerance():
    want = torch.ones(4, 4)
    got = want.clone()
    got[2, 3] += 1e-3
    with pytest.raises(AssertionError) as failure:
        assert_close(got, want, rounding(torch.float32, 100), "layer.weight")
    text = str(failure.value)
    assert "layer.weight" in text and "Greatest absolute difference" in text
    assert "(2, 3)" in text and "sqrt(100)" in text


def test_adam_bound_allows_what_near_eps_gradients_explain_and_nothing_more():
    weight = torch.linspace(-1.0, 1.0, 6)
    grads_a = torch.tensor([0.5, -0.2, 1e-8, -3e-9, 0.0, 2.0])
    grads_b = grads_a.clone()
    grads_b[2] += 5e-10  # rounding noise on a gradient the size of Adam's eps
    a, b = _adam_step(weight, grads_a), _adam_step(weight, grads_b)
    assert (a - b).abs().max() > 1e-4  # the old fixed 1e-4 bound would have failed
    assert_adam_step_close({"w": a}, {"w": b}, {"w": grads_a}, {"w": grads_b}, 0.01, 1e-8)
    moved = a.clone()
    moved[0] += 1e-5  # a large gradient: its step is lr * sign(g), nothing explains this
    with pytest.raises(AssertionError, match=r"w: 1 of 6 elements .* worst at \(0,\)"):
        assert_adam_step_close({"w": moved}, {"w": b}, {"w": grads_a}, {"w": grads_b},
                               0.01, 1e-8)


def test_transformer_terms_count_every_reduction():
    class Config:
        hidden_size, num_attention_heads, intermediate_size = 8, 2, 16
        num_hidden_layers, vocab_size = 2, 10

    layer = 8 + 4 + 5 + 8 + 8 + 16
    assert transformer_terms(Config, 5) == 2 * layer + 8 + 10
    assert transformer_terms(Config, 5, backward=True) == 2 * (2 * layer + 18) + 5
