"""The built-in tiny reward model (tools/make_tiny_reward_model.py): small, loads offline
with the tiny policy's tokenizer, and ranks right answers of the arithmetic task above
near misses."""

import random

import torch

from siirl.engine.models.loader import tiny_arith_dir
from siirl.engine.reward_model.loading import BUILTIN_TINY_REWARD, tiny_reward_dir

torch.set_num_threads(1)


def test_the_asset_is_small_and_shares_the_policys_tokenizer():
    folder = tiny_reward_dir()
    files = {p.name for p in folder.iterdir()}
    assert {"README.md", "config.json", "model.safetensors"} <= files
    assert sum(p.stat().st_size for p in folder.iterdir()) < 2 * 1024 * 1024
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).read_bytes() == (tiny_arith_dir() / name).read_bytes()
    assert BUILTIN_TINY_REWARD in (folder / "README.md").read_text()


def test_right_answers_outscore_near_misses():
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_reward_dir())
    model = AutoModelForSequenceClassification.from_pretrained(tiny_reward_dir()).eval()
    rng = random.Random(0)
    pairs = []
    for _ in range(60):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        answer, wrong = a + b, a + b + rng.choice((-2, -1, 1, 2))
        pairs += [f"{a}+{b}={answer}</s>", f"{a}+{b}={wrong}</s>"]
    enc = tok(pairs, padding=True, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        scores = model(**enc).logits[:, 0].view(-1, 2)
    assert (scores[:, 0] > scores[:, 1]).float().mean() >= 0.9
    assert scores[:, 0].mean() > 0.7 and scores[:, 1].mean() < 0.3
