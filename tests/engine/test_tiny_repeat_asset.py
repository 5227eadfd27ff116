"""The built-in tiny model for the repeat task (``tools/make_tiny_model.py --task repeat``):
it loads offline by its builtin name, fits the longest answer, and starts in the greedy
range GRPO needs on the validation prompts the job writes for ``data.builtin_task=repeat``."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from siirl.data_coordinator.settings import DataArguments  # noqa: E402
from siirl.data_coordinator.tasks.repeat import MAX_K, MAX_UNIT, make_splits  # noqa: E402

ASSET = (Path(__file__).resolve().parents[2] / "packages" / "siirl-engine" / "src" / "siirl"
         / "engine" / "assets" / "tiny_repeat")
BUILTIN = "builtin:tiny-repeat"


@pytest.fixture(scope="module")
def loaded():
    from siirl.engine.models import loader

    kind, where, gguf = loader.resolve_model_path(BUILTIN)
    assert (kind, Path(where).resolve(), gguf) == ("dir", ASSET.resolve(), None)
    model, tok = loader.load_model_and_tokenizer({"path": BUILTIN})
    return model.float().eval(), tok


def test_asset_is_small_and_has_its_card():
    names = {p.name for p in ASSET.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "README.md"} <= names
    assert sum(p.stat().st_size for p in ASSET.iterdir()) < 2 * 1024 * 1024
    card = (ASSET / "README.md").read_text()
    assert card.startswith("# tiny_repeat\n") and "--task repeat" in card and BUILTIN in card


def test_positions_fit_the_longest_prompt_and_answer(loaded):
    model, tok = loaded
    longest_prompt = len(tok("abcd*10=", add_special_tokens=False)["input_ids"])
    assert model.config.max_position_embeddings >= longest_prompt + MAX_UNIT * MAX_K + 4
    assert tok.decode(tok("ab*3=")["input_ids"]) == "ab*3="
    assert tok.unk_token_id not in tok("abcd*10=")["input_ids"]


def test_greedy_accuracy_leaves_room_for_rl(loaded):
    model, tok = loaded
    _, val = make_splits(seed=DataArguments().seed)
    prompts = [r["prompt"][0]["content"] for r in val]
    enc = tok(prompts, padding=True, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=MAX_UNIT * MAX_K + 4, do_sample=False,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    hits = sum(t.strip() == r["reward_model"]["ground_truth"]
               for t, r in zip(texts, val, strict=True))
    assert 0.15 <= hits / len(val) <= 0.35  # the builder's stopping window
