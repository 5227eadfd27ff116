"""The tiny VLA model (``siirl.engine.models.tiny_vla``) and its shipped asset
(``builtin:tiny-vla``, made by tools/make_tiny_vla.py): placeholders filled from images and
proprio, logits only on the action tokens, a KV cache that reproduces a full forward, the
log-prob path, and a shipped model that loads offline and succeeds greedily sometimes."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from siirl.engine.fsdp.sharding import decoder_layers  # noqa: E402
from siirl.engine.models import loader  # noqa: E402
from siirl.engine.models.logprob import response_logprobs  # noqa: E402
from siirl.engine.models.tiny_vla import (  # noqa: E402
    NON_ACTION_LOGIT,
    TinyVLAConfig,
    TinyVLAForActionPrediction,
)
from siirl.environment.embodied.action_tokens import ActionTokenizer  # noqa: E402
from siirl.environment.embodied.tasks.reach2d import Reach2D  # noqa: E402
from siirl.environment.embodied.vla_inputs import (  # noqa: E402
    action_tokenizer_for,
    vla_prompt_ids,
)
from siirl_numerics import (  # noqa: E402
    assert_close,
    rounding,
    scale_of,
    vla_terms,
)

VOCAB, BINS, IMAGE, PROPRIO = 64, 32, 4, 5


def _terms(model, positions):
    return vla_terms(model.config, positions)


def tolerance(model, want, positions):
    """Two forwards of the same inputs that sum in another order (cached decode, fewer
    logits kept): the size is the action logits' (the others are a constant, exactly
    equal)."""
    return rounding(torch.float32, _terms(model, positions),
                    scale_of(want[..., VOCAB - BINS:]), want.numel())


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = TinyVLAConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=2, head_dim=16,
                        image_grid=2, image_channels=(8, 8), action_bins=BINS,
                        image_token_id=IMAGE, proprio_token_id=PROPRIO)
    return TinyVLAForActionPrediction(cfg).eval()


def _batch(rows=(3, 1), response=3, size=16):
    """Left-padded prompts ``words + 4 image + proprio`` plus ``response`` action tokens;
    ``(ids, mask, positions, pixel_values, proprio)``."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(6, 20, (n,), generator=gen).tolist() + [IMAGE] * 4 + [PROPRIO]
               for n in rows]
    width = max(map(len, prompts)) + response
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        seq = p + torch.randint(VOCAB - BINS, VOCAB, (response,), generator=gen).tolist()
        ids[i, width - len(seq):] = torch.tensor(seq)
        mask[i, width - len(seq):] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    pixels = torch.randint(0, 256, (len(rows), size, size, 3), dtype=torch.uint8,
                           generator=gen)
    return ids, mask, pos, pixels, torch.rand((len(rows), 3), generator=gen)


def test_shapes_and_action_only_logits(model):
    ids, mask, pos, pixels, proprio = _batch()
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, pixel_values=pixels,
                proprio=proprio)  # proprio [B, 3]: padded to proprio_dim with zeros
    assert out.logits.shape == (2, ids.shape[1], VOCAB)
    assert (out.logits[..., :VOCAB - BINS] == NON_ACTION_LOGIT).all()
    actions = out.logits[..., VOCAB - BINS:]
    assert torch.isfinite(actions).all() and actions.abs().max() < 1e3
    kept = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                 pixel_values=pixels.float() / 255, proprio=proprio, logits_to_keep=2)
    assert kept.logits.shape == (2, 2, VOCAB)  # float images in [0, 1] == uint8 / 255
    want = out.logits[:, -2:]
    assert_close(kept.logits, want, tolerance(model, want, ids.shape[1]), "kept logits")
    # the image and proprio matter
    other = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                  pixel_values=pixels.flip(1), proprio=proprio + 1).logits
    assert not torch.allclose(other[:, -1], out.logits[:, -1])


def test_prefill_then_cached_decode_equals_full_forward(model):
    ids, mask, pos, pixels, proprio = _batch(response=3)
    full = model(input_ids=ids, attention_mask=mask, position_ids=pos, pixel_values=pixels,
                 proprio=proprio).logits
    prompt = ids.shape[1] - 3
    out = model(input_ids=ids[:, :prompt], attention_mask=mask[:, :prompt],
                position_ids=pos[:, :prompt], pixel_values=pixels, proprio=proprio,
                use_cache=True, logits_to_keep=1)
    assert hasattr(out.past_key_values, "reorder_cache")  # what sampler.decode needs
    steps = [out.logits[:, -1]]
    for t in range(prompt, ids.shape[1] - 1):
        extras = {"pixel_values": pixels, "proprio": proprio} if t == prompt else {}
        out = model(input_ids=ids[:, t:t + 1], attention_mask=mask[:, :t + 1],
                    position_ids=pos[:, t:t + 1], past_key_values=out.past_key_values,
                    use_cache=True, logits_to_keep=1, **extras)  # extras ignored when decoding
        steps.append(out.logits[:, -1])
    want = full[:, prompt - 1:-1]
    assert_close(torch.stack(steps, 1), want, tolerance(model, want, ids.shape[1]),
                 "cached decode's logits")


def test_placeholder_mismatches_are_errors(model):
    ids, mask, pos, pixels, proprio = _batch()
    wrong = ids.clone()
    wrong[0, -5] = 7  # row 0 loses an image placeholder (the last 4: proprio, 3 actions)
    with pytest.raises(ValueError, match=r"exactly 4 image placeholders.*\[3, 4\]"):
        model(input_ids=wrong, pixel_values=pixels, proprio=proprio)
    wrong = ids.clone()
    wrong[1, -1] = PROPRIO  # row 1 gets two proprio placeholders
    with pytest.raises(ValueError, match=r"exactly 1 proprio placeholder.*\[1, 2\]"):
        model(input_ids=wrong, pixel_values=pixels, proprio=proprio)
    with pytest.raises(ValueError, match="no pixel_values"):
        model(input_ids=ids, proprio=proprio)
    with pytest.raises(ValueError, match="no proprio"):
        model(input_ids=ids, pixel_values=pixels)
    with pytest.raises(ValueError, match=r"pixel_values must be \[2, H, W, 3\]"):
        model(input_ids=ids, pixel_values=pixels[:1], proprio=proprio)


class _WithInputs(torch.nn.Module):
    """A model whose forward gets the batch's images and proprio (as the actor will)."""

    def __init__(self, model, **extras):
        super().__init__()
        self.model, self.extras = model, extras

    def forward(self, logits_to_keep=0, **kwargs):
        return self.model(logits_to_keep=logits_to_keep, **kwargs, **self.extras)


def test_response_logprobs_and_gradients(model):
    ids, mask, pos, pixels, proprio = _batch(response=3)
    wrapped = _WithInputs(model, pixel_values=pixels, proprio=proprio)
    logp, entropy = response_logprobs(wrapped, ids, mask, pos, 3, calculate_entropy=True)
    assert logp.shape == entropy.shape == (2, 3)
    assert torch.isfinite(entropy).all() and (entropy <= np.log(BINS) + 1e-4).all()
    acts = ActionTokenizer(VOCAB, bins=BINS)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                   pixel_values=pixels, proprio=proprio).logits[:, -4:-1]
    want = acts.log_probs(logits, ids[:, -3:])
    assert_close(logp, want, rounding(torch.float32, _terms(model, ids.shape[1]),
                                      scale_of(want), want.numel()), "log-probs")
    model.zero_grad()
    logp.sum().backward()
    for part in (model.vision.convs[0].weight, model.proprio_proj.weight,
                 model.model.layers[0].mlp.up_proj.weight):
        assert part.grad is not None and part.grad.abs().sum() > 0
    model.zero_grad()


def test_fsdp_layers_checkpointing_and_save_load(model, tmp_path):
    assert len(decoder_layers(model)) == 2
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert type(again) is TinyVLAForActionPrediction
    assert again.lm_head.weight.data_ptr() == again.model.embed_tokens.weight.data_ptr()
    ids, mask, pos, pixels, proprio = _batch()
    kwargs = {"use_reentrant": False}  # as the loader turns it on (transformers 5 renamed it)
    if hasattr(again, "activation_checkpointing_enable"):
        again.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        again.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    assert again.model.gradient_checkpointing
    again.train()
    kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=pos, pixel_values=pixels,
                  proprio=proprio)
    torch.testing.assert_close(again(**kwargs).logits, model(**kwargs).logits)


# ---- the shipped asset ---------------------------------------------------------------

@pytest.fixture(scope="module")
def shipped():
    if not (loader.tiny_vla_dir() / "config.json").is_file():
        pytest.skip("the tiny VLA asset is not built (tools/make_tiny_vla.py)")
    vla, tok = loader.load_model_and_tokenizer({"path": "builtin:tiny-vla"})
    return vla.eval(), tok


def test_shipped_asset_loads(shipped):
    vla, tok = shipped
    names = {p.name for p in loader.tiny_vla_dir().iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "README.md", "vla_envs.json"} <= names
    cfg = vla.config
    assert isinstance(vla, TinyVLAForActionPrediction) and cfg.model_type == "siirl_tiny_vla"
    assert cfg.vocab_size == len(tok) and cfg.action_bins == 256
    assert tok.convert_tokens_to_ids(["<image>", "<proprio>"]) == [cfg.image_token_id,
                                                                   cfg.proprio_token_id]
    assert sum(p.numel() for p in vla.parameters()) < 1_000_000
    record = json.loads((loader.tiny_vla_dir() / "vla_envs.json").read_text())
    assert record["action_chunks_len"] * record["action_token_len"] == 8


@torch.no_grad()
def test_shipped_asset_succeeds_greedily_sometimes(shipped):
    vla, tok = shipped
    record = json.loads((loader.tiny_vla_dir() / "vla_envs.json").read_text())
    k = record["action_chunks_len"]
    acts = action_tokenizer_for(tok)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # small batches are faster on one thread (on 2 cores)
    try:
        runs = [(task, seed) for task in ("reach_red", "reach_green", "reach_blue",
                                          "reach_yellow") for seed in range(4)]
        envs = [Reach2D(**record["env"]["env_config"]) for _ in runs]
        obs = [env.reset(task, seed) for env, (task, seed) in zip(envs, runs, strict=True)]
        successes, live = 0, list(range(len(runs)))
        while live:
            prompts = [vla_prompt_ids(tok, obs[i]["instruction"], vla.config.image_tokens)
                       for i in live]
            assert len({len(p) for p in prompts}) == 1  # reach instructions: equal lengths
            ids = torch.tensor(prompts)
            pixels = torch.from_numpy(np.stack([obs[i]["image"] for i in live]))
            proprio = torch.from_numpy(np.stack([obs[i]["proprio"] for i in live]))
            out = vla(input_ids=ids, pixel_values=pixels, proprio=proprio, use_cache=True,
                      logits_to_keep=1)
            tokens = []
            for _ in range(2 * k):
                tokens.append(out.logits[:, -1].argmax(-1))
                out = vla(input_ids=tokens[-1][:, None], past_key_values=out.past_key_values,
                          use_cache=True, logits_to_keep=1)
            chunks = acts.chunk(torch.stack(tokens, 1).numpy().reshape(-1), 2)
            still = []
            for row, i in enumerate(live):
                obs[i], _, done, info = envs[i].step(chunks[row * k:(row + 1) * k])
                successes += bool(info["success"])
                if not done:
                    still.append(i)
            live = still
    finally:
        torch.set_num_threads(before)
    assert successes > 0
