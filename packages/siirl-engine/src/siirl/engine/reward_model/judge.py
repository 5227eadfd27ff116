"""``GenerativeJudge``: role ``reward_model`` with ``reward_model.style=generative``, an LLM
asked to grade each response.

Each row's question (its last user message, else its prompt text) and response (decoded by
the actor's tokenizer) fill ``reward_model.judge.template`` (placeholders ``{question}`` and
``{response}``), rendered through the judge's chat template when it has one. The judge
answers in at most ``reward_model.judge.max_new_tokens`` tokens, greedily unless
``actor_rollout_ref.rollout.val_kwargs`` say otherwise; the score is the last number after
``Score:`` in the template's last line and the reply (so a template ending in ``Score:``
takes a bare number), clipped to ``[0, max_score]`` and divided by ``max_score``. A reply
without one scores 0 and is counted in ``reward/rm/unparsed``. Text in the response itself
is never parsed, so a response cannot grade itself by writing ``Score: 10``. A prompt longer
than ``reward_model.max_length`` (else the judge tokenizer's ``model_max_length`` less the
reply) keeps its last tokens: the response and ``Score:``.

The judge is ``reward_model.judge.source``: ``rollout``, the actor's rollout engine (the
policy judges itself; with vLLM or SGLang that is a server call), or ``model``, a causal LM
loaded from ``reward_model.model.path`` and sampled by the built-in HF sampler.
"""

from __future__ import annotations

import re
import time
from typing import Any, List, Optional

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.dataloader.partitioned_dataset import render_prompt
from siirl.data_coordinator.fields import RESPONSE_MASK, RESPONSES, SAMPLE_ID
from siirl.engine.reward_model import inputs
from siirl.engine.reward_model.combine import RM_SCORES, place_on_last_token, score_metrics
from siirl.errors import ConfigError
from siirl.params import SiiRLArguments

TEMPLATE_KEY = "reward_model.judge.template"
DEFAULT_TEMPLATE = ("Rate the response to the question from 0 to 10.\n"
                    "Question: {question}\nResponse: {response}\nScore:")
_SCORE = re.compile(r"score\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")


def parse_score(reply: str, tail: str = "") -> Optional[float]:
    """The judge's grade: the last ``Score: <number>`` in ``tail + reply``, where ``tail``
    is the template's text after the response (a template ending in ``Score:`` makes a
    bare leading number the grade); None when there is none."""
    text = tail + reply
    found = _SCORE.findall(text)
    if found:
        return float(found[-1])
    if tail.strip().lower().endswith("score:"):
        bare = _NUMBER.match(reply)
        if bare:
            return float(bare.group(1))
    return None


def normalise(score: Optional[float], max_score: float) -> float:
    """``score`` in ``[0, 1]`` (0 for None)."""
    if score is None:
        return 0.0
    return min(max(score, 0.0), max_score) / max_score


def check_template(template: str) -> str:
    missing = [p for p in ("{question}", "{response}") if p not in template]
    if missing:
        raise ConfigError(f"{TEMPLATE_KEY} must contain the placeholders {{question}} and "
                          f"{{response}}; it lacks {' and '.join(missing)}: {template!r}")
    return template


def template_tail(template: str) -> str:
    """The template's last line after ``{response}``: the text the judge's reply follows."""
    after = template.rsplit("{response}", 1)[-1]
    last = after.rsplit("\n", 1)[-1]
    return "" if "{question}" in last else last


def questions(batch: Any, tokenizer: Any) -> List[str]:
    """Each row's last user message, else its prompt text."""
    messages = inputs.prompt_messages(batch)
    texts = None
    out = []
    for i in range(batch.batch_size[0]):
        users = [m.get("content", "") for m in (messages[i] if messages else [])
                 if m.get("role") == "user"]
        if users:
            out.append(str(users[-1]))
            continue
        texts = texts if texts is not None else inputs.prompt_texts(batch, tokenizer)
        out.append(texts[i])
    return out


class GenerativeJudge:
    """``rollout`` generates the judge's replies (any engine with ``overridden(n,
    response_length)`` and ``generate``); ``tokenizer`` is the judge's,
    ``input_tokenizer`` the one of the batch's ids."""

    def __init__(self, cfg: SiiRLArguments, rollout: Any, tokenizer: Any,
                 input_tokenizer: Optional[Any] = None):
        judge = cfg.reward_model.judge
        if not hasattr(rollout, "overridden"):
            raise ConfigError(f"reward_model.style=generative: the rollout engine "
                              f"{type(rollout).__name__} has no overridden(n, "
                              "response_length), which the judge needs for its replies")
        self.rollout = rollout
        self.judge_tokenizer = tokenizer
        self.input_tokenizer = input_tokenizer if input_tokenizer is not None else tokenizer
        self.template = check_template(str(judge.template or DEFAULT_TEMPLATE))
        self.tail = template_tail(self.template)
        self.max_new_tokens = int(judge.max_new_tokens)
        self.max_score = float(judge.max_score)
        for key, value in (("reward_model.judge.max_new_tokens", self.max_new_tokens),
                           ("reward_model.judge.max_score", self.max_score)):
            if not value > 0:
                raise ConfigError(f"{key}={value} must be > 0")
        # the prompt keeps its last tokens (the response and "Score:") within the judge's
        # context: reward_model.max_length, else the tokenizer's limit less the reply
        limit = inputs.context_limit(tokenizer)
        self.max_length = cfg.reward_model.max_length or (
            max(limit - self.max_new_tokens, 1) if limit else None)
        self.pad_id = int(getattr(tokenizer, "pad_token_id", None) or 0)

    def prompts(self, batch: Any) -> List[List[int]]:
        """The judge's prompt ids of each row (the last ``reward_model.max_length``)."""
        asked = questions(batch, self.input_tokenizer)
        answers = inputs.response_texts(batch, self.input_tokenizer)
        rows = []
        for question, response in zip(asked, answers, strict=True):
            # replace, not str.format: questions and responses may hold braces
            text = self.template.replace("{question}", question).replace("{response}",
                                                                         response)
            rendered = render_prompt(self.judge_tokenizer, [{"role": "user", "content": text}])
            rows.append(inputs.encode(self.judge_tokenizer, rendered))
        return inputs.truncate(rows, self.max_length)

    def replies(self, batch: Any) -> List[str]:
        """The judge's reply to each row (greedy under the default val_kwargs)."""
        rows = batch.batch_size[0]
        judged = inputs.left_padded(self.prompts(batch), self.pad_id)
        if SAMPLE_ID in batch.keys():  # noise keyed by the row, so a rerun judges alike
            judged.set(SAMPLE_ID, batch.get(SAMPLE_ID).long() * (1 << 20) + torch.arange(rows))
        with self.rollout.overridden(n=1, response_length=self.max_new_tokens):
            out = self.rollout.generate(judged, validate=True).batch
        mask = out.get(RESPONSE_MASK)
        keep = inputs.masked_rows(out.get(RESPONSES), mask)
        return inputs.decode(self.judge_tokenizer, keep)

    def compute_rm_score(self, batch: Any) -> NodeOutput:
        start = time.perf_counter()
        rows = batch.batch_size[0]
        grades = [parse_score(r, self.tail) for r in self.replies(batch)] if rows else []
        scores = torch.tensor([normalise(g, self.max_score) for g in grades],
                              dtype=torch.float32)
        batch.set(RM_SCORES, place_on_last_token(scores, inputs.response_mask(batch)))
        metrics = score_metrics(scores)
        metrics["reward/rm/unparsed"] = float(sum(g is None for g in grades))
        metrics["timing_s/reward_model"] = time.perf_counter() - start
        return NodeOutput(batch=batch, metrics=metrics)
