"""The built-in tiny arithmetic model (made by tools/make_tiny_model.py) loads offline, has
the task's tokenizer, and starts in the greedy-accuracy range the default GRPO job needs."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ASSET = (Path(__file__).resolve().parents[2] / "packages" / "siirl-engine" / "src" / "siirl"
         / "engine" / "assets" / "tiny_arith")


def _problems() -> list[tuple[str, int]]:
    out = []
    for a in range(21):
        for b in range(21):
            out.append((f"{a}+{b}=", a + b))
            if a >= b:
                out.append((f"{a}-{b}=", a - b))
    return out


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(ASSET, local_files_only=True)


@pytest.fixture(scope="module")
def model():
    m = transformers.AutoModelForCausalLM.from_pretrained(ASSET, local_files_only=True)
    return m.eval()


def test_asset_files_are_small():
    names = {p.name for p in ASSET.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors",
            "tokenizer.json", "tokenizer_config.json", "README.md"} <= names
    assert sum(p.stat().st_size for p in ASSET.iterdir()) < 2 * 1024 * 1024


def test_tokenizer_is_character_level(tokenizer):
    ids = tokenizer("13+5=")["input_ids"]
    assert len(ids) == 5  # no BOS, one token per character
    assert tokenizer.decode(ids) == "13+5="
    assert tokenizer.convert_ids_to_tokens(ids) == list("13+5=")
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id,
            tokenizer.unk_token_id) == (0, 1, 2, 3)
    assert tokenizer.chat_template is None
    assert tokenizer.decode(tokenizer("18")["input_ids"] + [2, 0], skip_special_tokens=True) \
        == "18"
    assert tokenizer.decode(tokenizer("the sum is 7.")["input_ids"]) == "the sum is 7."
    assert tokenizer.unk_token_id not in tokenizer("hello, world!")["input_ids"]


def test_tokenizer_pads_on_the_left(tokenizer):
    enc = tokenizer(["1+2=", "20-13="], padding=True)
    assert enc["input_ids"][0][:2] == [0, 0]
    assert enc["attention_mask"][0] == [0, 0, 1, 1, 1, 1]


def test_model_config(model):
    cfg = model.config
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (0, 1, 2)
    assert model.generation_config.eos_token_id == 2
    assert model.generation_config.pad_token_id == 0
    assert cfg.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) < 500_000


def test_greedy_accuracy_leaves_room_for_rl(model, tokenizer):
    problems = random.Random(1234).sample(_problems(), 50)
    enc = tokenizer([p for p, _ in problems], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=6, do_sample=False)
    resp = out[:, enc["input_ids"].shape[1]:]
    assert bool((resp == tokenizer.eos_token_id).any(1).all()), "every answer ends with EOS"
    texts = tokenizer.batch_decode(resp, skip_special_tokens=True)
    hits = 0
    for text, answer in zip(texts, (a for _, a in problems), strict=True):
        assert re.fullmatch(r"-?\d+", text), text
        hits += int(text) == answer
    assert 0.05 <= hits / len(problems) <= 0.50
