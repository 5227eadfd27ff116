"""The rollout's sampler gives exactly the plain loop's tokens (greedy and keyed sampling,
left-padded prompts of different lengths, groups of samples, EOS mid-way, top-k/top-p),
while prefilling each prompt once and dropping finished rows; and the faster sampling
arithmetic picks the tokens the original formula picks."""

from types import SimpleNamespace

import pytest
import torch
from test_hf_rollout import EOS, PAD  # one padding convention for the rollout tests
from test_hf_rollout import left_padded as padded_prompts
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import Cache

from siirl.engine.rollout import sampler
from siirl.engine.rollout.hf_rollout import decode
from siirl.engine.rollout.keyed_random import row_keys, uniforms
from siirl.engine.rollout.reference import reference_decode
from siirl.engine.rollout.sampler import distinct_rows
from siirl.engine.rollout.sampling import sample_next_token

SAMPLED = [dict(temperature=1.0), dict(temperature=0.7, top_k=5), dict(top_p=0.8),
           dict(temperature=1.3, top_k=8, top_p=0.9)]


def tiny_llama(seed=1, eos_boost=2.0):
    """A random Llama with peaked next-token distributions whose EOS logit is raised for
    every row alike, so responses end at various steps, greedy ones too (a row-dependent
    bias would tie tokens to batch positions, which the sampler changes)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=PAD, eos_token_id=EOS, bos_token_id=1)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight *= 10.0
        model.lm_head.weight[EOS] = 0.0
    boost = torch.nn.functional.one_hot(torch.tensor(EOS), 32) * eos_boost
    model.lm_head.register_forward_hook(lambda _m, _i, out: out + boost)
    return model


def left_padded(prompts, n=1):
    """(input_ids, attention_mask, position_ids), each prompt repeated n times in a row."""
    return tuple(t.repeat_interleave(n, dim=0) for t in padded_prompts(prompts))


PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [20, 21], [3], [22, 23, 24, 25, 26]]


def both(model, inputs, new_tokens=10, greedy=False, eos_ids=(EOS,), **knobs):
    rows = inputs[0].shape[0]
    keys = None if greedy else row_keys(3, torch.arange(rows))
    args = (model, *inputs, new_tokens, list(eos_ids), PAD, greedy)
    return (decode(*args, **knobs, keys=keys), reference_decode(*args, **knobs, keys=keys))


@pytest.fixture
def reorders(monkeypatch):
    """The row counts of every KV-cache row selection (copies to samples, drops)."""
    sizes = []
    real = Cache.reorder_cache
    monkeypatch.setattr(Cache, "reorder_cache",
                        lambda cache, rows: (sizes.append(rows.numel()), real(cache, rows)))
    return sizes


@pytest.mark.parametrize("knobs", [None, *SAMPLED])
def test_same_tokens_as_the_plain_loop(knobs, reorders):
    model = tiny_llama()
    inputs = left_padded(PROMPTS, n=4)  # groups of 4 samples: prefilled once per prompt
    new, ref = both(model, inputs, greedy=knobs is None, **(knobs or {}))
    assert torch.equal(new, ref)
    # rows end mid-way, others run to the end
    ended = (ref[:, 1:] == EOS).any(1)
    assert 0 < ended.sum() < ref.shape[0] and ref.shape[1] == 10
    # 5 prefilled rows copied to 20, then finished rows dropped (the reference: none)
    assert reorders[0] == 20 and 4 <= min(reorders[1:]) < 20


def test_same_tokens_for_distinct_prompts_few_rows_and_no_eos():
    model = tiny_llama(seed=0)
    for inputs in (left_padded(PROMPTS), left_padded(PROMPTS[:1], n=8),
                   left_padded(PROMPTS[:3]), left_padded(PROMPTS[1:2]),
                   left_padded(PROMPTS[:2], n=2)):
        new, ref = both(model, inputs, **SAMPLED[1])
        assert torch.equal(new, ref)
    new, ref = both(model, left_padded(PROMPTS, n=2), eos_ids=())  # ignore_eos
    assert torch.equal(new, ref) and new.shape == (10, 10)


def test_every_row_finishing_stops_early_and_nothing_to_do():
    model = tiny_llama(eos_boost=50.0)  # EOS first everywhere
    new, ref = both(model, left_padded(PROMPTS, n=3))
    assert torch.equal(new, ref) and new.shape == (15, 1) and new.eq(EOS).all()
    ids, mask, pos = left_padded(PROMPTS)
    assert decode(model, ids, mask, pos, 0, [EOS], PAD, True).shape == (5, 0)
    assert decode(model, ids[:0], mask[:0], pos[:0], 4, [EOS], PAD, True).shape == (0, 0)


def test_a_cache_that_is_not_a_transformers_cache_uses_the_plain_loop():
    class CountingLM(torch.nn.Module):
        """Next token = last token + 1; its 'cache' is a plain tuple."""
        config = None

        def forward(self, input_ids, attention_mask=None, position_ids=None,
                    past_key_values=None, use_cache=True):
            logits = torch.nn.functional.one_hot((input_ids + 1) % 32, 32).float() * 10
            return SimpleNamespace(logits=logits, past_key_values=("opaque",))

    inputs = left_padded(PROMPTS[:2], n=2)
    new, ref = both(CountingLM(), inputs, new_tokens=3, greedy=True)
    assert torch.equal(new, ref) and new[0].tolist() == [9, 10, 11]


def test_distinct_rows_finds_runs_of_equal_rows():
    ids = torch.tensor([[1, 2], [1, 2], [3, 4], [3, 4], [3, 4], [1, 2]])
    first, inverse = distinct_rows(ids)
    assert first.tolist() == [0, 2, 5] and inverse.tolist() == [0, 0, 1, 1, 1, 2]
    mask = torch.tensor([[1, 1], [0, 1], [1, 1], [1, 1], [1, 1], [1, 1]])  # a column differs
    assert distinct_rows(ids, mask)[0].tolist() == [0, 1, 2, 5]
    first, inverse = distinct_rows(ids[:2], at_least=4)  # padded with repeats of the first
    assert first.tolist() == [0, 0, 0, 0] and inverse.tolist() == [0, 0]
    assert distinct_rows(ids[1:3]) is None


def original_sample_next_token(logits, greedy, temperature=1.0, top_k=-1, top_p=1.0,
                               noise=None):
    """The formula as first written (the contract the faster version keeps)."""
    if greedy:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = (probs.cumsum(dim=-1) - probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    cdf = probs.double().cumsum(dim=-1)
    target = noise.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]
    return (cdf <= target).sum(dim=-1).clamp(max=logits.shape[-1] - 1)


def test_sampling_picks_what_the_original_formula_picks():
    torch.manual_seed(0)
    keys = row_keys(5, torch.arange(512))
    logits = torch.randn(512, 300) * 4
    logits[:64, 10:20] = 3.0  # ties, and rows with a dominant token
    logits[64:128, 7] = 40.0
    noise = uniforms(keys, 0)
    noise[:4] = torch.tensor([0.0, 1.0 - 2**-53, 0.5, 0.25])  # the edges of [0, 1)
    for temperature in (1.0, 0.6, 1.7):
        for top_k, top_p in ((-1, 1.0), (7, 1.0), (-1, 0.9), (20, 0.5), (-1, 1e-6)):
            knobs = (False, temperature, top_k, top_p, noise)
            assert torch.equal(sample_next_token(logits, *knobs),
                               original_sample_next_token(logits, *knobs))
    assert torch.equal(sample_next_token(logits, True), logits.argmax(-1))


def test_builtin_model_main_job_batch():
    """The built-in model on arithmetic prompts, 8 samples each, as in the main job."""
    from siirl.engine.models.loader import tiny_arith_dir
    if not (tiny_arith_dir() / "config.json").is_file():
        pytest.skip("built-in asset siirl/engine/assets/tiny_arith/ not built yet")
    from siirl.engine.models.loader import load_model_and_tokenizer
    model, tok = load_model_and_tokenizer({"path": "builtin:tiny-arith"})
    model.eval()
    tok.padding_side = "left"
    enc = tok(["13+5=", "2+2=", "20-7=", "100-1=", "7+8=", "3-3="], return_tensors="pt",
              padding=True, add_special_tokens=False)
    pos = (enc["attention_mask"].cumsum(1) - 1).clamp(min=0)
    inputs = tuple(t.repeat_interleave(8, dim=0)
                   for t in (enc["input_ids"], enc["attention_mask"], pos))
    keys = row_keys(1, torch.arange(48) // 8, torch.arange(48) % 8)
    args = (model, *inputs, 8, [tok.eos_token_id], tok.pad_token_id)
    for greedy in (True, False):
        assert torch.equal(decode(*args, greedy, keys=keys),
                           reference_decode(*args, greedy, keys=keys))


def test_public_names_still_in_hf_rollout():
    from siirl.engine.rollout import hf_rollout
    assert hf_rollout.decode is sampler.decode
    assert hf_rollout.sample_next_token is sample_next_token
    assert {"HFRollout", "decode", "postprocess_responses",
            "sample_next_token"} <= set(hf_rollout.__all__)
