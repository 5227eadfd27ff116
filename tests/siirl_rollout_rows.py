"""A small rollout batch for engine tests: left-padded prompts and responses of random
token ids, with advantages (what an actor's ``compute_log_prob`` and ``update_policy``
read)."""

import torch


def rollout_rows(vocab: int, rows: int = 4, prompt: int = 6, response: int = 6,
                 seed: int = 0):
    """``rows`` rows of ``prompt`` + ``response`` tokens below ``vocab`` (from 3: past the
    special ids); row 0 is left-padded by two tokens."""
    from siirl.data_coordinator.protocol import make_batch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    return make_batch({
        "input_ids": ids, "attention_mask": mask,
        "position_ids": (mask.cumsum(1) - 1).clamp(min=0), "responses": ids[:, prompt:],
        "response_mask": torch.ones(rows, response),
        "advantages": torch.randn(rows, response, generator=g)})
