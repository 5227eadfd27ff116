"""Rollout-like batches for the reward-model tests: left-padded prompts, right-padded
responses, masks and positions as the rollout writes them."""

from typing import List, Optional, Sequence

import torch

from siirl.data_coordinator import protocol
from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    POSITION_IDS,
    PROMPTS,
    RAW_PROMPT,
    RESPONSE_MASK,
    RESPONSES,
)


def rollout_batch(prompts: Sequence[List[int]], responses: Sequence[List[int]], pad_id: int,
                  width: int = 6, messages: Optional[list] = None):
    p_width = max(len(p) for p in prompts)
    rows = len(prompts)
    prompt_ids = torch.full((rows, p_width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((rows, p_width), dtype=torch.long)
    resp = torch.full((rows, width), pad_id, dtype=torch.long)
    resp_mask = torch.zeros((rows, width), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        prompt_ids[i, p_width - len(p):] = torch.tensor(p)
        prompt_mask[i, p_width - len(p):] = 1
        resp[i, :len(r)] = torch.tensor(r)
        resp_mask[i, :len(r)] = 1
    attention = torch.cat([prompt_mask, resp_mask.long()], dim=1)
    batch = protocol.make_batch({
        PROMPTS: prompt_ids, RESPONSES: resp, RESPONSE_MASK: resp_mask,
        INPUT_IDS: torch.cat([prompt_ids, resp], dim=1), ATTENTION_MASK: attention,
        POSITION_IDS: (attention.cumsum(dim=1) - 1).clamp(min=0)})
    if messages is not None:
        protocol.set_non_tensor(batch, RAW_PROMPT, messages)
    return batch


class ShiftedTokenizer:
    """A character tokenizer whose ids differ from the tiny models' (``ord(c) + 100``; pad
    and EOS 0 and 1): a policy tokenizer the reward model does not share."""

    pad_token_id, eos_token_id = 0, 1
    chat_template = None

    def get_vocab(self):
        return {"<pad>": 0, "</s>": 1}

    def encode(self, text, add_special_tokens=False):
        return [ord(c) + 100 for c in text]

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(i - 100) for i in row if i >= 100) for row in rows]
