"""The episode log-prob head: one forward per played chunk, laid out as [B, T * A]."""

import pytest
import torch

from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    PIXEL_VALUES,
    POSITION_IDS,
    PROPRIO,
    RESPONSES,
)
from siirl.data_coordinator.protocol import make_batch
from siirl.engine.actor.embodied_actor import episode_logprobs, is_episode_batch
from siirl.engine.fsdp.engines import logprob_heads
from siirl.engine.models.logprob import logprobs_from_logits
from siirl.engine.models.tiny_vla import TinyVLAConfig, TinyVLAForActionPrediction
from siirl_numerics import assert_close, rounding, scale_of, vla_terms

CHUNKS, PER_CHUNK, PAD = 3, 4, 0


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = TinyVLAConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=2, head_dim=16,
                           image_grid=2, proprio_dim=4, action_bins=256, image_token_id=4,
                           proprio_token_id=5)
    return TinyVLAForActionPrediction(config).eval()


def _rows(model):
    """Two episodes: 3 chunks and 1 chunk played; prompts of different lengths."""
    config = model.config
    prompts = [[7, 8, 9] + [4] * config.image_tokens + [5], [7] + [4] * config.image_tokens + [5]]
    width = max(map(len, prompts))
    ids = torch.full((2, width), PAD)
    mask = torch.zeros((2, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    generator = torch.Generator().manual_seed(1)
    actions = torch.randint(300 - 256, 300, (2, CHUNKS * PER_CHUNK), generator=generator)
    played = torch.zeros((2, CHUNKS * PER_CHUNK), dtype=torch.long)
    played[0] = 1
    played[1, :PER_CHUNK] = 1
    actions = torch.where(played.bool(), actions, torch.full_like(actions, PAD))
    attention = torch.cat([mask, played], dim=1)
    pixels = torch.randint(0, 256, (2, CHUNKS, 16, 16, 3), dtype=torch.uint8,
                           generator=generator)
    proprio = torch.randn((2, CHUNKS, 4), generator=generator)
    batch = make_batch({INPUT_IDS: torch.cat([ids, actions], dim=1), ATTENTION_MASK: attention,
                        POSITION_IDS: (attention.cumsum(1) - 1).clamp(min=0),
                        RESPONSES: actions, PIXEL_VALUES: pixels, PROPRIO: proprio})
    return batch, prompts, played


def test_each_chunk_is_scored_with_its_own_observation(model):
    batch, prompts, played = _rows(model)
    assert is_episode_batch(batch)
    out = episode_logprobs(model, batch, temperature=1.3, calculate_entropy=True)
    assert out["log_probs"].shape == (2, CHUNKS * PER_CHUNK)
    for row, prompt in enumerate(prompts):
        for step in range(CHUNKS):
            span = slice(step * PER_CHUNK, (step + 1) * PER_CHUNK)
            if not played[row, span].any():
                assert out["log_probs"][row, span].eq(0).all()
                continue
            seq = torch.tensor([prompt + batch[RESPONSES][row, span].tolist()])
            logits = model(input_ids=seq, pixel_values=batch[PIXEL_VALUES][row, step][None],
                           proprio=batch[PROPRIO][row, step][None]).logits
            expected, entropy = logprobs_from_logits(logits, seq, PER_CHUNK, 1.3, True)
            # one chunk alone vs the episode's rows: the same sums in another order
            for name, want in (("log_probs", expected[0]), ("entropy", entropy[0])):
                tol = rounding(torch.float32, vla_terms(model.config, seq.shape[1]),
                               scale_of(want), want.numel())
                assert_close(out[name][row, span], want, tol, f"row {row} chunk {step} {name}")
    # only action tokens can be chosen: every log-prob is that of a real distribution
    assert out["log_probs"][played.bool()].lt(0).all()


def test_the_actor_head_routes_episode_rows_and_gradients_flow(model):
    batch, _, played = _rows(model)
    head = logprob_heads()(CHUNKS * PER_CHUNK, 1.0, False)
    out = head.fn(model, batch)
    loss = -(out["log_probs"] * played).sum()
    model.zero_grad()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
