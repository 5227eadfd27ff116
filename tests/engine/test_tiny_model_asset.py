"""The built-in tiny arithmetic models (made by tools/make_tiny_model.py) load offline, have
the task's tokenizer, and start in the greedy-accuracy range the default GRPO job needs.

Both assets go through the same checks: ``tiny_arith`` (the default job's model, head
dimension 16) and ``tiny_arith_hd32`` (2 heads of dimension 32, for vLLM's CPU attention)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ASSETS = (Path(__file__).resolve().parents[2] / "packages" / "siirl-engine" / "src" / "siirl"
          / "engine" / "assets")
# asset directory -> (builtin name for actor_rollout_ref.model.path, attention heads, head dim)
BUILTINS = {"tiny_arith": ("builtin:tiny-arith", 4, 16),
            "tiny_arith_hd32": ("builtin:tiny-arith-hd32", 2, 32)}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _problems() -> list[tuple[str, int]]:
    out = []
    for a in range(21):
        for b in range(21):
            out.append((f"{a}+{b}=", a + b))
            if a >= b:
                out.append((f"{a}-{b}=", a - b))
    return out


@pytest.fixture(scope="module", params=sorted(BUILTINS))
def asset(request) -> Path:
    return ASSETS / request.param


@pytest.fixture(scope="module")
def tokenizer(asset):
    return transformers.AutoTokenizer.from_pretrained(asset, local_files_only=True)


@pytest.fixture(scope="module")
def model(asset):
    m = transformers.AutoModelForCausalLM.from_pretrained(asset, local_files_only=True)
    return m.eval()


def test_asset_files_are_small(asset):
    names = {p.name for p in asset.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors",
            "tokenizer.json", "tokenizer_config.json", "README.md"} <= names
    assert sum(p.stat().st_size for p in asset.iterdir()) < 2 * 1024 * 1024


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


def test_model_config(model, asset):
    cfg = model.config
    _, heads, head_dim = BUILTINS[asset.name]
    assert cfg.num_attention_heads == cfg.num_key_value_heads == heads
    assert cfg.hidden_size // cfg.num_attention_heads == head_dim
    assert getattr(cfg, "head_dim", head_dim) == head_dim
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (64, 3, 58)
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


def test_hd32_shares_tiny_arith_tokenizer():
    """Same tokenizer files, byte for byte, so prompts and rewards are the same task."""
    for name in TOKENIZER_FILES:
        assert (ASSETS / "tiny_arith_hd32" / name).read_bytes() \
            == (ASSETS / "tiny_arith" / name).read_bytes(), name


def test_model_card_records_the_command(asset):
    card = (asset / "README.md").read_text()
    assert card.startswith(f"# {asset.name}\n")
    assert "python tools/make_tiny_model.py" in card
    if asset.name != "tiny_arith":
        assert f"--out packages/siirl-engine/src/siirl/engine/assets/{asset.name}" in card
        assert BUILTINS[asset.name][0] in card


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_name_loads_offline(name):
    """The loader resolves the builtin name to the asset and loads it without a network."""
    from siirl.engine.models import loader

    builtin, heads, head_dim = BUILTINS[name]
    kind, where, gguf = loader.resolve_model_path(builtin)
    assert (kind, Path(where).resolve(), gguf) == ("dir", (ASSETS / name).resolve(), None)
    model, tok = loader.load_model_and_tokenizer({"path": builtin})
    assert model.config.num_attention_heads == heads
    assert model.config.hidden_size // model.config.num_attention_heads == head_dim
    ids = torch.tensor([tok.encode("13+5=", add_special_tokens=False)])
    out = model.generate(ids, max_new_tokens=3, do_sample=False,
                         pad_token_id=tok.pad_token_id)
    assert out.shape[1] > ids.shape[1]


def test_missing_builtin_is_a_config_error(monkeypatch, tmp_path):
    from siirl.engine.models import loader
    from siirl.errors import ConfigError

    monkeypatch.setattr(loader, "_asset_dir", lambda name: tmp_path / name)
    for builtin in (None, *(b for b, _, _ in BUILTINS.values())):
        with pytest.raises(ConfigError, match="built-in model is missing") as err:
            loader.resolve_model_path(builtin)
        assert (builtin or "builtin:tiny-arith") in str(err.value)
