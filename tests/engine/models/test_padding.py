"""on_used_columns: a forward on the columns some row uses equals the full-width one."""

import torch
from test_response_logprobs import padded_batch, tiny_llama, tolerance

from siirl.engine.critic.value_model import response_values, value_model_from_lm
from siirl.engine.models.logprob import response_logprobs
from siirl.engine.models.padding import on_used_columns, used_columns
from siirl_numerics import assert_close


def widen(ids, mask, pos, left, right):
    """The same batch with ``left`` extra pad columns before and ``right`` after."""
    rows = ids.shape[0]
    ids = torch.cat([ids.new_zeros(rows, left), ids, ids.new_zeros(rows, right)], dim=1)
    mask = torch.cat([mask.new_zeros(rows, left), mask, mask.new_zeros(rows, right)], dim=1)
    after = pos[:, -1:] + torch.arange(1, right + 1)
    pos = torch.cat([pos[:, :1].expand(rows, left), pos, after], dim=1)
    return ids, mask, pos


def logprob_fn(module, ids, mask, pos, width):
    logp, ent = response_logprobs(module, ids, mask, pos, width, 0.7, True)
    return {"log_probs": logp, "entropy": ent}


def test_used_columns_bounds():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 0]])
    assert used_columns(mask, 3) == (2, 6, 2)
    # never into the response on the left, never below one response column on the right
    assert used_columns(torch.tensor([[0, 0, 0, 0, 0, 1, 0]]), 3) == (3, 6, 2)
    assert used_columns(torch.tensor([[1, 1, 1, 1, 0, 0, 0]]), 3) == (0, 5, 1)


def test_log_probs_and_gradients_equal_full_width():
    model = tiny_llama()
    ids, mask, pos, rlen = padded_batch([[5, 6, 7], [8, 9, 10, 11], [14]],
                                        [[3, 4, 2], [20, 21], [25]])
    ids, mask, pos = widen(ids, mask, pos, left=3, right=4)
    width = rlen + 4
    full = logprob_fn(model, ids, mask, pos, width)
    full["log_probs"][mask[:, -width:].bool()].sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    used = on_used_columns(logprob_fn, model, ids, mask, pos, width)
    used["log_probs"][mask[:, -width:].bool()].sum().backward()
    valid = mask[:, -width:].bool()
    for name in ("log_probs", "entropy"):
        assert used[name].shape == full[name].shape == (3, width)
        want_values = full[name][valid]
        assert_close(used[name][valid], want_values,
                     tolerance(model, want_values, ids.shape[1]), name)
        assert not used[name][~valid].any()  # padded positions hold zeros
    for (name, param), exp in zip(model.named_parameters(), want, strict=True):
        assert_close(param.grad, exp, tolerance(model, exp, ids.shape[1], backward=True,
                                                tokens=ids.numel()), name)


def test_values_equal_full_width():
    lm = tiny_llama()
    critic = value_model_from_lm(lm)
    ids, mask, pos, rlen = padded_batch([[5, 6], [8, 9, 10]], [[3], [20, 21]])
    ids, mask, pos = widen(ids, mask, pos, left=2, right=3)
    width = rlen + 3
    with torch.no_grad():
        full = response_values(critic, ids, mask, pos, width)
        used = on_used_columns(lambda m, i, a, p, w: {"values": response_values(m, i, a, p, w)},
                               critic, ids, mask, pos, width)["values"]
    valid = mask[:, -width:].bool()
    assert_close(used[valid], full[valid], tolerance(lm, full[valid], ids.shape[1]), "values")
