"""What a reward model reads of a rollout batch: each row's prompt and response as token
ids of the model's own tokenizer, left-padded.

When the reward model's tokenizer is the actor's (same vocabulary and chat template) the
actor's ids are reused as they are. Otherwise (verl's ``reward_model.model.input_tokenizer``:
the tokenizer of the actor's ids) the prompt and response are decoded and written again
for the reward model: the chat messages plus the response as the assistant's turn through
its chat template when it has one, else the prompt text followed by the response, then
tokenized. ``reward_model.max_length`` keeps the last tokens of longer rows (the response
end, where the score is read).
"""

from __future__ import annotations

from itertools import compress
from typing import Any, Dict, List, Optional, Sequence

import torch

from siirl.data_coordinator import protocol
from siirl.data_coordinator.dataloader.partitioned_dataset import encode_text, render_prompt
from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    POSITION_IDS,
    PROMPT_TEXT,
    PROMPTS,
    RAW_PROMPT,
    RESPONSE_MASK,
    RESPONSES,
)


def response_mask(batch: Any) -> torch.Tensor:
    """The response tokens to score (the response part of attention_mask when the batch has
    no response_mask)."""
    if RESPONSE_MASK in batch.keys():
        return batch.get(RESPONSE_MASK)
    return batch.get(ATTENTION_MASK)[:, -batch.get(RESPONSES).shape[1]:]


def masked_rows(ids: torch.Tensor, mask: torch.Tensor) -> List[List[int]]:
    """Each row's ids where its mask is set."""
    keep = (mask > 0).tolist()
    return [list(compress(row, k)) for row, k in zip(ids.tolist(), keep, strict=True)]


def actor_rows(batch: Any) -> List[List[int]]:
    """Each row's attended ids (prompt, then response: tool results of a multi-turn
    rollout included), in the actor's tokenizer."""
    return masked_rows(batch.get(INPUT_IDS), batch.get(ATTENTION_MASK))


def decode(tokenizer: Any, rows: Sequence[List[int]]) -> List[str]:
    if not rows:
        return []
    batch_decode = getattr(tokenizer, "batch_decode", None)
    if batch_decode is None:
        return [tokenizer.decode(r, skip_special_tokens=True) for r in rows]
    return list(batch_decode(list(rows), skip_special_tokens=True))


def response_texts(batch: Any, tokenizer: Any) -> List[str]:
    """Each row's response, decoded by the actor's tokenizer without special tokens."""
    width = batch.get(RESPONSES).shape[1]
    attended = batch.get(ATTENTION_MASK)[:, -width:]  # env tokens too (multi-turn)
    return decode(tokenizer, masked_rows(batch.get(INPUT_IDS)[:, -width:], attended))


def prompt_messages(batch: Any) -> Optional[List[List[Dict[str, str]]]]:
    """Each row's chat messages, when the batch carries them."""
    if RAW_PROMPT not in batch.keys():
        return None
    return [list(m) if m is not None else [] for m in protocol.get_non_tensor(batch, RAW_PROMPT)]


def prompt_texts(batch: Any, tokenizer: Any) -> List[str]:
    """Each row's prompt as text: its messages' contents (the last user turn for a judge's
    question is picked by the caller), the rendered prompt, or the decoded prompt ids."""
    if PROMPT_TEXT in batch.keys():
        return [str(t) for t in protocol.get_non_tensor(batch, PROMPT_TEXT)]
    width = batch.get(RESPONSES).shape[1]
    ids = batch.get(PROMPTS) if PROMPTS in batch.keys() else batch.get(INPUT_IDS)[:, :-width]
    mask = batch.get(ATTENTION_MASK)[:, :ids.shape[1]]
    return decode(tokenizer, masked_rows(ids, mask))


def retokenized_rows(batch: Any, input_tokenizer: Any, tokenizer: Any) -> List[List[int]]:
    """Each row written again for ``tokenizer`` (see the module docstring)."""
    responses = response_texts(batch, input_tokenizer)
    messages = prompt_messages(batch)
    template = getattr(tokenizer, "chat_template", None)
    rows = []
    for i, response in enumerate(responses):
        if messages is not None and template:
            chat = messages[i] + [{"role": "assistant", "content": response}]
            text = tokenizer.apply_chat_template(chat, tokenize=False)
        else:
            prompt = render_prompt(tokenizer, messages[i]) if messages is not None else None
            text = (prompt if prompt is not None else prompt_texts(batch, input_tokenizer)[i]) \
                + response
        rows.append(encode(tokenizer, text))
    return rows


def encode(tokenizer: Any, text: str) -> List[int]:
    """``text``'s ids without added special tokens, quietly: a row longer than the
    tokenizer's ``model_max_length`` is cut by the caller, not warned about per call."""
    try:
        return [int(i) for i in tokenizer(text, add_special_tokens=False,
                                          verbose=False)["input_ids"]]
    except TypeError:  # a minimal tokenizer (tests): no keywords
        return encode_text(tokenizer, text)


def context_limit(tokenizer: Any) -> Optional[int]:
    """The tokenizer's ``model_max_length`` when it is a real limit (transformers puts a
    huge number there when the model sets none)."""
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if isinstance(limit, int) and 0 < limit < 1_000_000 else None


def truncate(rows: List[List[int]], max_length: Optional[int]) -> List[List[int]]:
    """The last ``max_length`` ids of each row (all of them when None)."""
    if not max_length:
        return rows
    return [r[-int(max_length):] for r in rows]


def left_padded(rows: Sequence[List[int]], pad_id: int) -> Any:
    """A batch of ``input_ids``, ``attention_mask`` and ``position_ids``, each row ending in
    the last column (so a model's score there is each row's last token)."""
    width = max([len(r) for r in rows] + [1])
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
    return protocol.make_batch({INPUT_IDS: ids, ATTENTION_MASK: mask,
                                POSITION_IDS: (mask.cumsum(dim=1) - 1).clamp(min=0)})
