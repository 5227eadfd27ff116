"""The engine policy every episode loop shares: left-padded prompts, the episode key as
``sample_id``, one reply per prompt within ``reply_tokens``, an engine that cannot give one
reply per episode refused."""

from contextlib import contextmanager

import pytest
import torch

from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    POSITION_IDS,
    RESPONSE_MASK,
    RESPONSES,
    SAMPLE_ID,
)
from siirl.errors import ConfigError
from siirl.execution.rollout_flow.engine_policy import EnginePolicy, left_padded


class EchoEngine:
    """Replies with its prompt's last token, ``key`` times (at most response_length)."""

    def __init__(self):
        self.seen, self.settings = [], None

    @contextmanager
    def overridden(self, **settings):
        self.settings = settings
        yield
        self.settings = None

    def generate(self, batch, validate=False):
        self.seen.append((batch, validate, dict(self.settings)))
        width = self.settings["response_length"]
        rows = batch[INPUT_IDS].shape[0]
        responses = torch.zeros((rows, width), dtype=torch.long)
        mask = torch.zeros((rows, width), dtype=torch.long)
        for row in range(rows):
            count = min(int(batch[SAMPLE_ID][row]), width)
            responses[row, :count] = batch[INPUT_IDS][row, -1]
            mask[row, :count] = 1
        return type("Out", (), {"batch": {RESPONSES: responses, RESPONSE_MASK: mask}})


def test_left_padding_and_positions():
    fields = left_padded([[5, 6, 7], [8], []], pad_id=0)
    assert fields[INPUT_IDS].tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert fields[ATTENTION_MASK].tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert fields[POSITION_IDS].tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 0]]
    assert left_padded([[], []], pad_id=9)[INPUT_IDS].tolist() == [[9], [9]]


def test_one_reply_per_prompt_keyed_by_episode():
    engine = EchoEngine()
    policy = EnginePolicy(engine, pad_id=0, reply_tokens=3, validate=True)
    assert policy([[4, 2], [7]], keys=[2, 5]) == [[2, 2], [7, 7, 7]]
    batch, validate, settings = engine.seen[0]
    assert batch[SAMPLE_ID].tolist() == [2, 5] and validate is True
    assert settings == {"n": 1, "response_length": 3}


def test_an_engine_without_one_reply_per_episode_is_refused():
    class Plain:
        def generate(self, batch, validate=False):
            raise AssertionError("not reached")

    with pytest.raises(ConfigError, match="Plain has no overridden"):
        EnginePolicy(Plain(), pad_id=0, reply_tokens=4, validate=False)
