"""tools/tiny_build.py, the tiny-model builders' shared pieces: the schedule, the shuffled
passes and the padding behave as the builders rely on, and the builders' tokenizers,
built through it, are byte for byte the ones shipped with the built-in assets."""

import filecmp
import random
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "packages/siirl-engine/src/siirl/engine/assets"
sys.path.insert(0, str(ROOT / "tools"))  # the builders import each other by module name

import tiny_build as tb  # noqa: E402


def test_warmup_then_cosine_down_to_the_floor():
    lr_at = tb.warmup_cosine(1.0, steps=100, warmup=10, floor=0.1)
    assert lr_at(0) == pytest.approx(0.1) and lr_at(9) == pytest.approx(1.0)
    assert lr_at(10) == pytest.approx(1.0)
    assert lr_at(55) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way down the cosine
    assert lr_at(100) == pytest.approx(0.1) and lr_at(500) == pytest.approx(0.1)


def test_shuffled_batches_cover_every_row_once_per_pass_and_span_passes():
    order = tb.Shuffled(5, 2, tb.python_permutation(random.Random(0)))
    batches = [order.next() for _ in range(5)]  # 10 indices: exactly two passes
    flat = [i for batch in batches for i in batch]
    assert sorted(flat[:5]) == sorted(flat[5:]) == list(range(5))
    assert all(len(batch) == 2 for batch in batches)
    torch_order = tb.Shuffled(4, 3, tb.torch_permutation(torch.Generator().manual_seed(0)))
    assert sorted(torch_order.next() + torch_order.next()[:1]) == [0, 1, 2, 3]


def test_padding_left_for_prompts_right_for_training():
    ids, mask, pos = tb.left_padded([[5, 6, 7], [8]])
    assert ids.tolist() == [[5, 6, 7], [tb.PAD_ID, tb.PAD_ID, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]] and pos.tolist() == [[0, 1, 2], [0, 0, 0]]
    ids, mask, lab = tb.right_padded([[5, 6, 7], [8]], [[-100, 6, 7], [8]])
    assert ids.tolist() == [[5, 6, 7], [8, tb.PAD_ID, tb.PAD_ID]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert lab.tolist() == [[-100, 6, 7], [8, -100, -100]]


def test_word_tokenizer_keeps_words_whole_and_round_trips():
    words = ["<answer>", "</answer>", "Left"]
    tok = tb.word_tokenizer(tb.SPECIALS + words + tb.PRINTABLE, words, max_length=32)
    text = "<answer>Left</answer> x"
    assert tok.convert_ids_to_tokens(tok.encode(text)) == [
        "<answer>", "Left", "</answer>", " ", "x"]
    assert tok.decode(tok.encode(text)) == text and tok.padding_side == "left"


@pytest.mark.parametrize("builder, asset", [("make_tiny_agent", "tiny_agent"),
                                            ("make_tiny_vla", "tiny_vla")])
def test_a_builders_tokenizer_is_the_shipped_one(builder, asset, tmp_path):
    if not (ASSETS / asset / "tokenizer.json").exists():
        pytest.skip(f"the {asset} asset is not built (tools/{builder}.py)")
    module = __import__(builder)
    tb.save_tokenizer(module.build_tokenizer(), tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert filecmp.cmp(ASSETS / asset / name, tmp_path / name, shallow=False), name
