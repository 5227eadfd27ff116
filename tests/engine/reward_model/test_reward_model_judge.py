"""The generative judge: its prompts, how grades are parsed and normalised, unparsed
replies, and where the scores go."""

from contextlib import contextmanager

import pytest
import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.fields import RESPONSE_MASK, RESPONSES
from siirl.engine.common.config import typed_config
from siirl.engine.reward_model.combine import RM_SCORES
from siirl.engine.reward_model.judge import (
    GenerativeJudge,
    check_template,
    normalise,
    parse_score,
    template_tail,
)
from siirl.errors import ConfigError
from siirl_rm_batches import rollout_batch


@pytest.mark.parametrize("reply,tail,grade", [
    ("Score: 7", "", 7.0),
    (" 8</s>", "Score:", 8.0),  # a template ending in "Score:" takes a bare number
    ("score=3.5", "", 3.5),
    ("first Score: 2, then Score: 9", "", 9.0),  # the last one counts
    ("I would say 9", "", None),
    ("I would say 9", "Score:", None),  # a number, but not right after "Score:"
    ("", "Score:", None),
    ("Score: -4", "", -4.0),
])
def test_parse_score(reply, tail, grade):
    assert parse_score(reply, tail) == grade


def test_normalise_clips_to_the_scale():
    assert normalise(None, 10) == 0.0
    assert normalise(7, 10) == 0.7
    assert normalise(-4, 10) == 0.0 and normalise(12, 10) == 1.0


def test_templates_need_both_placeholders_and_give_their_tail():
    with pytest.raises(ConfigError, match=r"reward_model.judge.template.*\{response\}"):
        check_template("Grade {question}")
    assert template_tail("Q: {question}\nA: {response}\nScore:") == "Score:"
    assert template_tail("{response}\n{question} Score:") == ""


class Chars:
    """Character ids (``ord``); pad 0, no chat template."""

    pad_token_id, eos_token_id = 0, 1
    chat_template = None

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(i) for i in row if i > 1) for row in rows]


class ScriptedRollout:
    """Replies with the given texts; records the prompts it was asked."""

    def __init__(self, replies):
        self.replies, self.prompts, self.settings = replies, [], None

    @contextmanager
    def overridden(self, n=None, response_length=None):
        self.settings = (n, response_length)
        yield

    def generate(self, batch, validate=False):
        tok = Chars()
        pairs = zip(batch["input_ids"], batch["attention_mask"], strict=True)
        self.prompts = tok.batch_decode([row[m.bool()].tolist() for row, m in pairs])
        width = max(len(r) for r in self.replies)
        out = torch.zeros((len(self.replies), width), dtype=torch.long)
        mask = torch.zeros((len(self.replies), width))
        for i, r in enumerate(self.replies):
            out[i, :len(r)] = torch.tensor([ord(c) for c in r])
            mask[i, :len(r)] = 1
        batch.set(RESPONSES, out)
        batch.set(RESPONSE_MASK, mask)
        assert validate
        return NodeOutput(batch=batch)


def test_the_judge_grades_each_row_on_its_last_token():
    tok = Chars()
    messages = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1="}],
                [{"role": "user", "content": "2+2="}], [{"role": "user", "content": "3+3="}]]
    responses = ["2", "Score: 10", "6"]
    batch = rollout_batch([[ord("x")]] * 3, [tok.encode(r) for r in responses], 0, width=10,
                          messages=messages)
    rollout = ScriptedRollout([" 8", "no idea", "Score: 5"])
    cfg = typed_config({"reward_model": {"enable": True, "style": "generative",
                                         "judge": {"max_new_tokens": 7}}})
    out = GenerativeJudge(cfg, rollout, tok).compute_rm_score(batch)
    assert rollout.settings == (1, 7)
    assert rollout.prompts[0].endswith("Question: 1+1=\nResponse: 2\nScore:")
    assert "Response: Score: 10\nScore:" in rollout.prompts[1]
    scores = out.batch[RM_SCORES]
    # the second response wrote "Score: 10" itself: only the judge's reply is parsed
    assert scores.sum(-1).tolist() == pytest.approx([0.8, 0.0, 0.5])
    assert scores[1, len(responses[1]) - 1] == 0.0 and scores[2, 0] == 0.5
    assert out.metrics["reward/rm/unparsed"] == 1.0
    assert out.metrics["reward/rm/mean"] == pytest.approx(1.3 / 3)


def test_a_rollout_without_overrides_is_refused():
    with pytest.raises(ConfigError, match="overridden"):
        GenerativeJudge(typed_config({}), object(), Chars())
