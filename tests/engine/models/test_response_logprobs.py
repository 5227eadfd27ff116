"""response_logprobs: one padded batched pass equals a naive per-sequence computation."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from siirl.engine.models.logprob import accepts_kwarg, response_logprobs
from siirl_numerics import assert_close, rounding, scale_of, transformer_terms

PAD = 0


def tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def tolerance(model, want, positions, backward=False, tokens=None):
    """Two forwards (or backwards) of the same model that sum in another order (batched and
    padded vs one sequence, fewer logits kept): float32 rounding of its reductions."""
    terms = transformer_terms(model.config, positions, backward, tokens)
    return rounding(torch.float32, terms, scale_of(want), want.numel())


def padded_batch(prompts, responses):
    """Left-padded prompts + right-padded responses, as the rollout emits them."""
    plen, rlen = max(map(len, prompts)), max(map(len, responses))
    rows = len(prompts)
    ids = torch.full((rows, plen + rlen), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[i, plen - len(p):plen] = torch.tensor(p)
        ids[i, plen:plen + len(r)] = torch.tensor(r)
        mask[i, plen - len(p):plen + len(r)] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    # positions of right padding keep counting, as the rollout's position_ids do
    pos[:, plen:] = pos[:, plen - 1:plen] + torch.arange(1, rlen + 1)
    return ids, mask, pos, rlen


def naive(model, prompt, response, temperature):
    seq = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=seq).logits[0].double() / temperature
    logp = logits.log_softmax(-1)
    out, ent = [], []
    for j, tok in enumerate(response):
        row = logp[len(prompt) + j - 1]
        out.append(row[tok].item())
        ent.append(-(row.exp() * row).sum().item())
    return out, ent


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_naive_per_sequence(temperature):
    model = tiny_llama()
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14]]
    responses = [[3, 4, 2], [20, 21, 22, 23, 24], [25]]
    ids, mask, pos, rlen = padded_batch(prompts, responses)
    with torch.no_grad():
        logp, ent = response_logprobs(model, ids, mask, pos, rlen, temperature, True)
    assert logp.shape == ent.shape == (3, rlen) and logp.dtype == torch.float32
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        want_lp, want_ent = map(torch.tensor, naive(model, p, r, temperature))
        assert_close(logp[i, :len(r)], want_lp, tolerance(model, want_lp, ids.shape[1]),
                     f"row {i} log-probs")
        assert_close(ent[i, :len(r)], want_ent, tolerance(model, want_ent, ids.shape[1]),
                     f"row {i} entropy")
    _, none = response_logprobs(model, ids, mask, pos, rlen, temperature)
    assert none is None


def test_same_result_without_logits_to_keep_and_grads_flow():
    model = tiny_llama()
    ids, mask, pos, rlen = padded_batch([[5, 6], [7, 8, 9]], [[10, 11], [12]])
    assert accepts_kwarg(model, "logits_to_keep")

    class Plain(torch.nn.Module):  # a wrapper whose forward names no logits_to_keep
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, position_ids, use_cache):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, use_cache=use_cache)

    assert not accepts_kwarg(Plain(model), "logits_to_keep")
    fast, _ = response_logprobs(model, ids, mask, pos, rlen)
    full, _ = response_logprobs(Plain(model), ids, mask, pos, rlen)
    assert_close(fast, full, tolerance(model, full, ids.shape[1]), "log-probs")
    (fast * torch.tensor([[1.0, 1.0], [1.0, 0.0]])).sum().backward()
    assert model.lm_head.weight.grad is not None
    with pytest.raises(ValueError):
        response_logprobs(model, ids, mask, pos, rlen, temperature=0.0)
