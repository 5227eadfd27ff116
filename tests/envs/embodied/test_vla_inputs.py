"""The VLA prompt/response convention (``vla_inputs``) with the tiny VLA's tokenizer: the
instruction round-trips, the placeholders follow it, the action tokens are the last ids in
``ActionTokenizer``'s order, and a tokenizer without placeholders is a clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

from siirl.environment.embodied.tasks.reach2d import TASKS, Reach2D  # noqa: E402
from siirl.environment.embodied.vla_inputs import (  # noqa: E402
    action_token_name,
    action_tokenizer_for,
    placeholder_ids,
    vla_prompt_ids,
)
from siirl.errors import ConfigError  # noqa: E402

ASSET = (Path(__file__).resolve().parents[3]
         / "packages/siirl-engine/src/siirl/engine/assets/tiny_vla")


@pytest.fixture(scope="module")
def tok():
    if not (ASSET / "tokenizer.json").is_file():
        pytest.skip("the tiny VLA asset is not built (tools/make_tiny_vla.py)")
    return AutoTokenizer.from_pretrained(str(ASSET), local_files_only=True)


def test_prompt_round_trip(tok):
    env = Reach2D(image_size=16)
    image_id, proprio_id = placeholder_ids(tok)
    for task in TASKS:
        instruction = env.reset(task, 0)["instruction"]
        ids = vla_prompt_ids(tok, instruction, 16)
        assert ids[-17:] == [image_id] * 16 + [proprio_id]
        assert tok.decode(ids[:-17]) == instruction
        assert tok.unk_token_id not in ids
        assert len(ids[:-17]) <= 13  # the instruction words are one token each
    # any printable text round-trips (unknown words fall back to characters)
    text = "Reach the purple box, 2x faster!"
    assert tok.decode(vla_prompt_ids(tok, text, 4)[:-5]) == text


def test_action_tokens_are_last(tok):
    acts = action_tokenizer_for(tok)
    assert (acts.vocab_size, acts.first_id) == (len(tok), len(tok) - 256)
    chunk = np.array([[-1.0, 1.0], [0.0, 0.5]], dtype=np.float32)
    ids = acts.encode(chunk.reshape(-1))
    assert tok.convert_ids_to_tokens(ids[:2].tolist()) == [action_token_name(0),
                                                           action_token_name(255)]
    assert ids.min() >= acts.first_id and max(placeholder_ids(tok)) < acts.first_id
    np.testing.assert_allclose(acts.chunk(ids, 2), chunk, atol=1 / 256)
    with pytest.raises(ConfigError):  # more bins than the vocabulary's action tokens
        action_tokenizer_for(tok, bins=300)


def test_non_vla_tokenizer_is_a_clear_error():
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "a": 3, " ": 4}
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    plain = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>",
                                    eos_token="</s>", unk_token="<unk>")
    with pytest.raises(ValueError, match="<image> or <proprio>.*not a vision-language"):
        vla_prompt_ids(plain, "a a", 16)
    # a plain vocabulary still gets OpenVLA-style bins over its last ids
    assert action_tokenizer_for(plain, bins=2).first_id == 3
