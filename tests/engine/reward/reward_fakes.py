"""Shared helpers for the reward-manager tests (a character-level fake tokenizer)."""

import torch

from siirl.data_coordinator.protocol import make_batch

PAD = 0


class CharTokenizer:
    """ids are ord(c); the pad id 0 is a special token."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == PAD))

    def batch_decode(self, rows, skip_special_tokens=True):
        return [self.decode(r, skip_special_tokens) for r in rows]


def make_reward_batch(responses, data_sources, ground_truths, width=None, extra_infos=None):
    """Right-padded character responses with response_mask 1 over each text."""
    width = width or max(len(r) for r in responses) + 2
    ids = torch.full((len(responses), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(responses), width), dtype=torch.float32)
    for i, text in enumerate(responses):
        ids[i, :len(text)] = torch.tensor([ord(c) for c in text], dtype=torch.long)
        mask[i, :len(text)] = 1.0
    non_tensors = {"data_source": list(data_sources), "ground_truth": list(ground_truths)}
    if extra_infos is not None:
        non_tensors["extra_info"] = list(extra_infos)
    return make_batch({"responses": ids, "response_mask": mask}, non_tensors)
