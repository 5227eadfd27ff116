"""use_remove_padding: the packed forward (one row of every attended token, positions
restarting per sequence) gives the padded forward's log-probs, entropy, values and
gradients, on the built-in tiny model with left-padded prompts and right-padded responses."""

import pytest
import torch
from test_response_logprobs import padded_batch
from transformers import PreTrainedModel

from siirl.data_coordinator.protocol import make_batch
from siirl.engine.critic.value_model import value_model_from_lm
from siirl.engine.fsdp.engines import logprob_heads, value_heads
from siirl.engine.models.loader import load_model
from siirl.engine.models.packing import pack, packs_natively
from siirl.params import ModelArguments
from siirl_numerics import assert_close, rounding, scale_of, transformer_terms

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14], [15, 16]]
RESPONSES = [[3, 4, 2], [20, 21], [25, 26, 27, 28, 29], []]  # the last row: empty response


def tolerance(tiny, want, backward=False):
    """Packed and padded rows sum the same terms in another order (the padded attention
    adds masked zeros): float32 rounding over the tiny model's reductions."""
    positions = max(map(len, PROMPTS)) + max(map(len, RESPONSES))
    terms = transformer_terms(tiny.config, positions, backward)
    return rounding(torch.float32, terms, scale_of(want), want.numel())


@pytest.fixture(scope="module")
def tiny():
    return load_model(ModelArguments(path=None), dtype=torch.float32)


def micro(**extra):
    ids, mask, pos, rlen = padded_batch(PROMPTS, RESPONSES)
    return make_batch({"input_ids": ids, "attention_mask": mask, "position_ids": pos,
                       **extra}), rlen


def run(head, module, batch, weights=None):
    """The head's outputs and, when ``weights`` is given, the parameter gradients of the
    weighted sum of its outputs (log-probs and entropy, or values)."""
    module.zero_grad()
    out = head.fn(module, batch)
    if weights is None:
        return out, None
    sum(out[name] * weights for name in head.outputs).sum().backward()
    return out, [p.grad.clone() for p in module.parameters() if p.grad is not None]


def assert_same(packed, padded, valid, tiny):
    for name in padded:
        assert packed[name].shape == padded[name].shape
        want = padded[name][valid]
        assert_close(packed[name][valid], want, tolerance(tiny, want), name)
        assert not packed[name][~valid].any()  # padded positions hold zeros


def test_log_probs_entropy_and_gradients_equal_padded(tiny):
    batch, rlen = micro()
    valid = batch["attention_mask"][:, -rlen:].bool()
    weights = valid * torch.linspace(-1.0, 1.0, valid.numel()).view_as(valid)
    got, got_grads = run(logprob_heads(remove_padding=True)(rlen, 0.7, True), tiny, batch,
                         weights)
    want, want_grads = run(logprob_heads()(rlen, 0.7, True), tiny, batch, weights)
    assert_same(got, want, valid, tiny)
    assert got["log_probs"][valid].lt(0).all()
    assert len(got_grads) == len(want_grads) > 0
    for a, b in zip(got_grads, want_grads, strict=True):
        assert_close(a, b, tolerance(tiny, b, backward=True), "gradient")


def test_values_and_gradients_equal_padded(tiny):
    critic = value_model_from_lm(tiny, seed=3)
    batch, rlen = micro()
    valid = batch["attention_mask"][:, -rlen:].bool()
    got, got_grads = run(value_heads(remove_padding=True)(rlen), critic, batch, valid.float())
    want, want_grads = run(value_heads()(rlen), critic, batch, valid.float())
    assert_same(got, want, valid, tiny)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert_close(a, b, tolerance(tiny, b, backward=True), "gradient")


def test_the_forward_is_one_row_of_attended_tokens(tiny, monkeypatch):
    batch, rlen = micro()
    seen = []
    forward = type(tiny).forward

    def spy(self, *args, **kwargs):
        seen.append(kwargs)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(tiny), "forward", spy)
    with torch.no_grad():
        logprob_heads(remove_padding=True)(rlen, 1.0, False).fn(tiny, batch)
    (call,) = seen
    total = sum(map(len, PROMPTS)) + sum(map(len, RESPONSES))
    assert call["input_ids"].shape == (1, total) and call["attention_mask"] is None
    lengths = [len(p) + len(r) for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)  # where each sequence's positions restart
    assert call["position_ids"][0, starts].eq(0).all()
    # logits only where a response token is predicted
    assert call["logits_to_keep"].numel() == sum(map(len, RESPONSES))


def test_rows_that_do_not_pack_run_padded(tiny):
    ids, mask, pos, rlen = padded_batch(PROMPTS, RESPONSES)
    assert pack(ids, mask, pos, rlen) is not None
    holed = mask.clone()
    holed[1, -rlen - 2] = 0  # a hole inside a prompt
    assert pack(ids, holed, pos, rlen) is None
    assert pack(ids, mask, pos + 1, rlen) is None  # positions not counted from 0
    assert pack(ids, mask, pos[None].expand(3, -1, -1), rlen) is None  # 3-D rope positions
    empty = mask.clone()
    empty[:, -rlen:] = 0  # no response token anywhere: nothing to score
    assert pack(ids, empty, pos, rlen) is None
    batch = make_batch({"input_ids": ids, "attention_mask": holed, "position_ids": pos})
    with torch.no_grad():
        got = logprob_heads(remove_padding=True)(rlen, 1.0, False).fn(tiny, batch)
        want = logprob_heads()(rlen, 1.0, False).fn(tiny, batch)
    torch.testing.assert_close(got["log_probs"], want["log_probs"], atol=0, rtol=0)


class Custom(PreTrainedModel):
    """A model of its own code, as ``trust_remote_code`` loads (how its masks treat packed
    rows is unknown); drops the extra inputs the tiny model does not take and records each
    call."""

    _supports_sdpa = True

    def __init__(self, lm):
        super().__init__(lm.config)
        self.lm = lm
        self.calls = []

    def forward(self, **kwargs):
        self.calls.append(kwargs)
        return self.lm(**{k: v for k, v in kwargs.items() if k != "pixel_values"})


def test_models_outside_transformers_run_padded(tiny):
    assert packs_natively(tiny) and packs_natively(value_model_from_lm(tiny))
    custom = Custom(tiny)
    assert not packs_natively(custom)
    batch, rlen = micro()
    with torch.no_grad():
        got = logprob_heads(remove_padding=True)(rlen, 1.0, False).fn(custom, batch)
        want = logprob_heads()(rlen, 1.0, False).fn(tiny, batch)
    assert custom.calls and all(c["attention_mask"] is not None for c in custom.calls)
    torch.testing.assert_close(got["log_probs"], want["log_probs"], atol=0, rtol=0)


def test_rows_with_extra_model_inputs_run_padded(tiny, monkeypatch):
    import siirl.engine.fsdp.engines as engines

    def refuse(*args, **kwargs):
        raise AssertionError("rows with extra model inputs must not be packed")

    monkeypatch.setattr(engines, "on_packed", refuse)
    batch, rlen = micro(pixel_values=torch.zeros(len(PROMPTS), 3))
    custom = Custom(tiny)
    with torch.no_grad():
        logprob_heads(remove_padding=True)(rlen, 1.0, False).fn(custom, batch)
    (call,) = custom.calls
    assert call["pixel_values"].shape == (len(PROMPTS), 3)
