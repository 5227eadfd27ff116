"""HFRollout: shapes, padding invariance, EOS/mask semantics, groups, sampling knobs,
validation sampling and in-place weight updates, on a tiny random Llama (CPU, seconds)."""

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from siirl.dag_worker.walk.engine_api import RolloutEngine
from siirl.data_coordinator.protocol import get_non_tensor, group_indices, make_batch
from siirl.engine.models.logprob import response_logprobs
from siirl.engine.rollout.hf_rollout import HFRollout, postprocess_responses, sample_next_token
from siirl_numerics import assert_close, rounding, scale_of, transformer_terms

PAD, EOS = 0, 2
TOK = SimpleNamespace(pad_token_id=PAD, eos_token_id=EOS)


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=PAD, eos_token_id=EOS, bos_token_id=1)
    return LlamaForCausalLM(cfg).eval()


def config(n=1, resp=6, **rollout):
    roll = {"n": n, "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True,
            "val_kwargs": {"n": 1, "do_sample": False, "temperature": 0.0}}
    roll.update(rollout)
    return {"data": {"max_response_length": resp}, "actor_rollout_ref": {"rollout": roll}}


def left_padded(prompts):
    """(input_ids, attention_mask, position_ids) of left-padded token lists."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0)


def prompt_batch(prompts):
    """Left-pad token lists into the dataloader's fields, plus non-tensor fields."""
    ids, mask, pos = left_padded(prompts)
    return make_batch({"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                      {"ground_truth": [str(i) for i in range(len(prompts))],
                       "extra_info": [{"i": i} for i in range(len(prompts))]})


PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [20, 21]]


def eos_bias(model, rows_forced, rows_banned):
    """A hook on lm_head: EOS becomes the argmax for some rows, impossible for others."""
    def hook(_mod, _inp, out):
        bias = torch.zeros_like(out)
        bias[rows_forced, :, EOS] = 1e4
        bias[rows_banned, :, EOS] = -1e4
        return out + bias
    return model.lm_head.register_forward_hook(hook)


def test_shapes_fields_and_metrics():
    model = tiny_llama()
    engine = HFRollout(role="rollout", config=config(n=2, resp=6), module=model, tokenizer=TOK)
    assert isinstance(engine, RolloutEngine)
    batch = prompt_batch(PROMPTS)
    out = engine.generate(batch)
    data, m = out.batch, out.metrics
    assert data.batch_size == torch.Size([6])
    assert data["prompts"].shape == (6, 7) and data["responses"].shape == (6, 6)
    assert data["response_mask"].dtype == torch.float32
    assert data["input_ids"].shape == data["attention_mask"].shape == (6, 13)
    assert torch.equal(data["input_ids"][:, :7], data["prompts"])
    assert torch.equal(data["input_ids"][:, 7:], data["responses"])
    assert torch.equal(data["attention_mask"][:, 7:].float(), data["response_mask"])
    # positions continue after each prompt's last one, whatever its padding
    last = batch["position_ids"][:, -1].repeat_interleave(2)
    assert torch.equal(data["position_ids"][:, 7:], last[:, None] + torch.arange(1, 7))
    assert get_non_tensor(data, "ground_truth") == ["0", "0", "1", "1", "2", "2"]
    assert "responses" not in batch.keys()  # the input batch is untouched
    lengths = data["response_mask"].sum(1)
    assert m["response_length/mean"] == pytest.approx(lengths.mean().item())
    assert m["response_length/max"] == lengths.max().item()
    assert m["response_length/min"] == lengths.min().item()
    assert m["rollout/tokens"] == lengths.sum().item()
    assert 0.0 <= m["response_length/clip_ratio"] <= 1.0


def test_left_padding_gives_same_greedy_response():
    model = tiny_llama()
    engine = HFRollout(config=config(resp=8), module=model, tokenizer=TOK)
    padded = engine.generate(prompt_batch(PROMPTS), validate=True).batch["responses"]
    for i, p in enumerate(PROMPTS):
        alone = engine.generate(prompt_batch([p]), validate=True).batch["responses"]
        assert torch.equal(padded[i], alone[0]), i


def test_eos_mask_and_padding_semantics():
    model = tiny_llama()
    engine = HFRollout(config=config(resp=5), module=model, tokenizer=TOK)
    handle = eos_bias(model, rows_forced=[0], rows_banned=[1, 2])
    try:
        out = engine.generate(prompt_batch(PROMPTS), validate=True)
    finally:
        handle.remove()
    resp, mask = out.batch["responses"], out.batch["response_mask"]
    assert resp[0].tolist() == [EOS, PAD, PAD, PAD, PAD]
    assert mask[0].tolist() == [1, 0, 0, 0, 0]
    assert mask[1:].eq(1).all() and not resp[1:].eq(EOS).any()
    assert out.metrics["response_length/clip_ratio"] == pytest.approx(2 / 3)
    # post-processing alone: EOS mid-way, none, pad == EOS, and a short (early-stopped) run
    tokens = torch.tensor([[7, 2, 9, 9], [7, 8, 9, 10], [2, 2, 2, 2]])
    r, msk = postprocess_responses(tokens, 6, eos_ids=[2], pad_id=2)
    assert r.tolist() == [[7, 2, 2, 2, 2, 2], [7, 8, 9, 10, 2, 2], [2, 2, 2, 2, 2, 2]]
    assert msk.tolist() == [[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]]


def test_n_repeat_groups_and_seeded_sampling():
    model = tiny_llama()
    engine = HFRollout(config=config(n=4, resp=6), module=model, tokenizer=TOK)
    torch.manual_seed(123)
    first = engine.generate(prompt_batch(PROMPTS)).batch
    groups = group_indices(first)
    assert list(groups.values()) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    extra = get_non_tensor(first, "extra_info")
    assert [e["i"] for e in extra] == [0] * 4 + [1] * 4 + [2] * 4
    for rows in groups.values():  # sampled: a group's responses are not all equal
        assert len({tuple(first["responses"][r].tolist()) for r in rows}) > 1
    torch.manual_seed(123)  # a fresh engine under the same seed replays the same samples
    again = HFRollout(config=config(n=4, resp=6), module=model,
                      tokenizer=TOK).generate(prompt_batch(PROMPTS)).batch
    assert torch.equal(first["responses"], again["responses"])
    # a second call in the same step is a new draw, not a replay
    third = engine.generate(prompt_batch(PROMPTS)).batch
    assert not torch.equal(first["responses"], third["responses"])


def test_keyed_sampling_does_not_depend_on_the_batch_split():
    """With dataloader sample ids, a prompt's responses are the same whether it is
    generated alone, in a batch with others, or in another order: a run on N workers
    samples what the run on one worker samples."""
    model = tiny_llama()
    batch = prompt_batch(PROMPTS)
    batch.set("sample_id", torch.tensor([10, 11, 12]))

    def responses(rows):
        engine = HFRollout(config=config(n=4, resp=6), module=model, tokenizer=TOK)
        out = engine.generate(batch[rows]).batch
        return {(uid, k % 4): tuple(out["responses"][k].tolist())
                for k, uid in enumerate(get_non_tensor(out, "uid"))}

    torch.manual_seed(0)
    whole = responses([0, 1, 2])
    torch.manual_seed(99)  # the global RNG plays no part
    parts = {**responses([2]), **responses([1, 0])}
    assert whole == parts
    assert sorted({uid for uid, _ in whole}) == ["10", "11", "12"]
    assert len(set(whole.values())) > 3  # and the samples do differ


def test_temperature_and_top_k():
    model = tiny_llama()
    batch = prompt_batch(PROMPTS)
    greedy = HFRollout(config=config(resp=6), module=model, tokenizer=TOK).generate(
        batch, validate=True).batch["responses"]
    for knobs in ({"top_k": 1}, {"temperature": 1e-4}, {"do_sample": False}):
        out = HFRollout(config=config(resp=6, **knobs), module=model, tokenizer=TOK)
        assert torch.equal(out.generate(batch).batch["responses"], greedy), knobs
    # top_k=0 and -1 both mean "off"; top-k keeps samples inside the k best tokens
    logits = torch.randn(1, 32).repeat(2000, 1)
    top3 = set(logits[0].topk(3).indices.tolist())
    for k in (0, -1):
        assert len(set(sample_next_token(logits, False, 1.0, k).tolist())) > 3
    assert set(sample_next_token(logits, False, 1.0, 3).tolist()) == top3
    nucleus = sample_next_token(logits, False, 1.0, -1, 1e-6)  # top_p ~ 0: the argmax only
    assert set(nucleus.tolist()) == {int(logits[0].argmax())}
    # a high temperature flattens the distribution: more distinct tokens than a low one
    hot = len(set(sample_next_token(logits * 3, False, 10.0).tolist()))
    cold = len(set(sample_next_token(logits * 3, False, 0.1).tolist()))
    assert hot > cold


def test_validate_uses_val_kwargs_and_greedy():
    model = tiny_llama()
    cfg = config(n=4, resp=6)
    engine = HFRollout(config=cfg, module=model, tokenizer=TOK)
    val = engine.generate(prompt_batch(PROMPTS), validate=True).batch
    assert val.batch_size == torch.Size([3])  # val_kwargs.n = 1, not rollout.n
    greedy = HFRollout(config=config(resp=6, do_sample=False), module=model, tokenizer=TOK)
    assert torch.equal(val["responses"], greedy.generate(prompt_batch(PROMPTS)).batch["responses"])
    cfg["actor_rollout_ref"]["rollout"]["val_kwargs"]["n"] = 2  # config is read at build
    engine = HFRollout(config=cfg, module=model, tokenizer=TOK)
    assert engine.generate(prompt_batch(PROMPTS), validate=True).batch.batch_size == (6,)


def test_uses_actor_module_in_place_and_restores_mode():
    model = tiny_llama()
    model.train()
    model.model.layers[0].eval()  # a submodule the actor keeps in eval mode
    actor = SimpleNamespace(module=model, tokenizer=TOK)
    engine = HFRollout(role="rollout", config=config(resp=6), peers={"actor": actor})
    before = engine.generate(prompt_batch(PROMPTS), validate=True).batch["responses"]
    assert model.training and not model.model.layers[0].training
    assert model.model.layers[1].training
    # an "optimizer step" in place: swap two lm_head rows, so the first greedy token of
    # prompt 0 (a) and token b trade logits; the engine must see it with no reload
    a = int(before[0, 0])
    b = 17 if a != 17 else 18
    with torch.no_grad():
        model.lm_head.weight[[a, b]] = model.lm_head.weight[[b, a]].clone()
    after = engine.generate(prompt_batch(PROMPTS), validate=True).batch["responses"]
    assert int(after[0, 0]) == b


def test_output_feeds_response_logprobs():
    """The actor's log-prob pass over the rollout's fields sees what decoding saw: each
    greedy token is the argmax of the unpadded sequence's distribution."""
    model = tiny_llama()
    data = HFRollout(config=config(resp=5), module=model, tokenizer=TOK).generate(
        prompt_batch(PROMPTS), validate=True).batch
    with torch.no_grad():
        logp, _ = response_logprobs(model, data["input_ids"], data["attention_mask"],
                                    data["position_ids"], 5)
        for i, p in enumerate(PROMPTS):
            seq = torch.tensor([p + data["responses"][i].tolist()])
            best = model(input_ids=seq).logits[0, len(p) - 1:-1].log_softmax(-1).max(-1)
            assert torch.equal(best.indices, data["responses"][i])
            # batched and padded vs one sequence: the same sums in another order
            assert_close(logp[i], best.values, rounding(
                torch.float32, transformer_terms(model.config, seq.shape[1]),
                scale_of(best.values), best.values.numel()), f"row {i} log-probs")


def _builtin_dir():
    from siirl.engine.models.loader import tiny_arith_dir
    return tiny_arith_dir()


@pytest.mark.skipif(not (_builtin_dir() / "config.json").is_file(),
                    reason="built-in asset siirl/engine/assets/tiny_arith/ not built yet")
def test_builtin_tiny_arith_rollout():
    from siirl.engine.models.loader import load_model_and_tokenizer
    model, tok = load_model_and_tokenizer({"path": "builtin:tiny-arith"})
    tok.padding_side = "left"
    enc = tok(["13+5=", "2+2=", "20-7="], return_tensors="pt", padding=True,
              add_special_tokens=False)
    pos = (enc["attention_mask"].cumsum(1) - 1).clamp(min=0)
    batch = make_batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                        "position_ids": pos}, {"ground_truth": ["18", "4", "13"]})
    out = HFRollout(config=config(n=2, resp=4), module=model, tokenizer=tok).generate(batch)
    data = out.batch
    assert data["responses"].shape == (6, 4)
    for row, mask in zip(data["responses"], data["response_mask"], strict=True):
        valid = row[mask.bool()].tolist()
        assert tok.eos_token_id not in valid[:-1]  # nothing valid after an EOS
