"""The prompt and response convention of a token-based VLA policy (``builtin:tiny-vla``).

One chunk step's prompt is ``instruction ids + [<image>] * image_tokens + [<proprio>]``
(no BOS, no chat template); the model replaces the placeholders' embeddings with the
camera image's tokens and the projected proprio vector, passed next to the ids as
``pixel_values`` / ``proprio``. The response is the chunk ``[k, action_dim]`` as
``ActionTokenizer.encode(chunk.reshape(-1))``: ``k * action_dim`` action tokens, action by
action, no EOS.

The tiny VLA's vocabulary ends with its 256 action tokens, named so that ``<a{i}>`` is
bin ``i`` (id ``vocab - 1 - i``, ``ActionTokenizer``'s order).
"""

from __future__ import annotations

from typing import Any, List

from siirl.environment.embodied.action_tokens import ActionTokenizer

__all__ = ["IMAGE_TOKEN", "PROPRIO_TOKEN", "action_token_name", "action_tokenizer_for",
           "placeholder_ids", "vla_prompt_ids"]

IMAGE_TOKEN = "<image>"
PROPRIO_TOKEN = "<proprio>"


def action_token_name(index: int) -> str:
    """The vocabulary entry of action bin ``index``."""
    return f"<a{int(index)}>"


def _token_id(tokenizer: Any, token: str) -> int | None:
    """``token``'s id when it is a whole entry of the vocabulary (not the unknown id)."""
    vocab = tokenizer.get_vocab()
    return vocab.get(token)


def placeholder_ids(tokenizer: Any) -> tuple[int, int]:
    """``(image_id, proprio_id)``; a ValueError when the tokenizer has no such entries (it
    belongs to a model that takes no image, not a VLA)."""
    image, proprio = _token_id(tokenizer, IMAGE_TOKEN), _token_id(tokenizer, PROPRIO_TOKEN)
    missing = [name for name, i in ((IMAGE_TOKEN, image), (PROPRIO_TOKEN, proprio))
               if i is None]
    if missing:
        raise ValueError(f"the tokenizer has no {' or '.join(missing)} token: the model is not "
                         "a vision-language-action model with image/proprio placeholders "
                         "(use builtin:tiny-vla or a VLA whose tokenizer has them)")
    return image, proprio


def vla_prompt_ids(tokenizer: Any, instruction: str, image_tokens: int) -> List[int]:
    """One chunk step's prompt ids (see the module docstring)."""
    image, proprio = placeholder_ids(tokenizer)
    ids = list(tokenizer.encode(instruction, add_special_tokens=False))
    return ids + [image] * int(image_tokens) + [proprio]


def action_tokenizer_for(tokenizer: Any, bins: int = 256, low: float = -1.0,
                         high: float = 1.0) -> ActionTokenizer:
    """The ``ActionTokenizer`` over ``tokenizer``'s vocabulary: every id below the action
    block is reserved. A tokenizer with ``<a{i}>`` entries reserves all the others (fewer
    entries than ``bins`` is a ConfigError); any other reserves up to its special and
    placeholder tokens (OpenVLA-style: the bins take the last, rarely used ids)."""
    size = len(tokenizer)
    vocab = tokenizer.get_vocab()
    named = sum(1 for i in range(size) if action_token_name(i) in vocab)
    if named:
        last = vocab.get(action_token_name(0))
        if last != size - 1:  # <a0> must be bin 0: the vocabulary's last id
            raise ValueError(f"{action_token_name(0)} has id {last}, not {size - 1} (the last "
                             "id, action bin 0)")
        reserved = size - named
    else:
        keep = [vocab[t] for t in (*tokenizer.all_special_tokens, IMAGE_TOKEN, PROPRIO_TOKEN)
                if t in vocab]
        reserved = max(keep, default=-1) + 1
    return ActionTokenizer(size, bins=bins, low=low, high=high, reserved=reserved)
