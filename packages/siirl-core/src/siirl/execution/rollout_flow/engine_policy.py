"""The policy every episode loop plays with: one reply per prompt from the worker's rollout
engine (HF, vLLM, ...), each seeded by its episode's key. In core, beside the episode
runner, as the multi-agent rollout plays with it too."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import torch

from siirl.data_coordinator import protocol
from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    POSITION_IDS,
    RESPONSE_MASK,
    RESPONSES,
    SAMPLE_ID,
)
from siirl.errors import ConfigError


def left_padded(prompts: Sequence[List[int]], pad_id: int) -> Dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``position_ids`` of prompts padded on the left."""
    width = max(1, max(len(p) for p in prompts))  # an empty prompt still gets a column
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt:
            ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt):] = 1
    return {INPUT_IDS: ids, ATTENTION_MASK: mask,
            POSITION_IDS: (mask.cumsum(dim=1) - 1).clamp(min=0)}


class EnginePolicy:
    """One reply per prompt from the worker's rollout engine, each seeded by its episode's
    key (the engine reads the key as the row's ``sample_id``)."""

    keyed = True

    def __init__(self, rollout: Any, pad_id: int, reply_tokens: int, validate: bool):
        if not hasattr(rollout, "overridden"):
            raise ConfigError(f"the rollout engine {type(rollout).__name__} has no "
                              "overridden(n, response_length): episode rollouts need one "
                              "reply per episode")
        self.rollout, self.pad_id = rollout, pad_id
        self.reply_tokens, self.validate = reply_tokens, validate

    def generate(self, fields: Dict[str, torch.Tensor], keys: List[int]) -> Any:
        """The engine's output batch for prompt ``fields`` (extra fields, e.g. images, ride
        along), one reply of at most ``reply_tokens`` per row."""
        fields = dict(fields)
        fields[SAMPLE_ID] = torch.tensor(keys, dtype=torch.long)
        batch = protocol.make_batch(fields)
        with self.rollout.overridden(n=1, response_length=self.reply_tokens):
            return self.rollout.generate(batch, validate=self.validate).batch

    def __call__(self, prompts: List[List[int]], keys: List[int]) -> List[List[int]]:
        out = self.generate(left_padded(prompts, self.pad_id), keys)
        return [row[mask.bool()].tolist()
                for row, mask in zip(out[RESPONSES], out[RESPONSE_MASK], strict=True)]
