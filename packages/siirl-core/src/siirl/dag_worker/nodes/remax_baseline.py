"""ReMax's greedy baseline, as two nodes of the ``remax`` workflow (see builtin_pipelines).

ReMax (arXiv 2310.10505; verl's ``adv_estimator=remax``) subtracts from each sampled
response's score the score of the greedy response to the same prompt. verl's trainer
generates that greedy response per prompt (``do_sample=False``), scores it and keeps the
summed score as ``reward_baselines``. Here the same happens in the graph, before the
sampled rollout, so the baseline rides along the prompt rows and is repeated with them:

- ``greedy_baseline_rollout`` (ROLLOUT): one greedy reply per prompt from the rollout
  engine; the reply's fields are kept beside the prompt's under ``GREEDY_PREFIX``.
- ``score_greedy_baseline`` (REWARD): scores those replies as the reward node scores
  responses (reward model first when enabled, then the reward manager), writes the summed
  token-level scores as ``reward_baselines`` and drops the reply's fields, handing the
  prompt rows on to the sampled rollout.
"""

from __future__ import annotations

from typing import Any

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    POSITION_IDS,
    PROMPTS,
    RESPONSE_MASK,
    RESPONSES,
    REWARD_BASELINES,
    TOKEN_LEVEL_SCORES,
)
from siirl.errors import ConfigError

# the fields a rollout writes; kept as GREEDY_PREFIX + name between the two nodes
REPLY_FIELDS = (PROMPTS, RESPONSES, RESPONSE_MASK, INPUT_IDS, ATTENTION_MASK, POSITION_IDS)
GREEDY_PREFIX = "remax_greedy__"


def score_rows(engines: Any, batch: Any) -> NodeOutput:
    """Scores of responses: the reward model's (``reward_model.enable``), which the reward
    manager then adds to its rule scores; else the manager's alone."""
    if engines.reward_model_enabled():
        scored = engines.reward_model.compute_rm_score(batch)
        out = engines.reward.compute_reward(scored.batch)
        return NodeOutput(batch=out.batch, metrics={**scored.metrics, **out.metrics})
    return engines.reward.compute_reward(batch)


def greedy_baseline_rollout(worker: Any, batch: Any) -> NodeOutput:
    rollout = worker.engines.rollout
    if not hasattr(rollout, "overridden"):
        raise ConfigError(
            f"algorithm.adv_estimator=remax needs a greedy reply per prompt, and the rollout "
            f"engine {type(rollout).__name__} has no overridden(n, response_length, greedy)")
    with rollout.overridden(n=1, greedy=True):
        out = rollout.generate(batch)
    reply = out.batch
    if reply.batch_size[0] != batch.batch_size[0]:
        raise ConfigError(f"the rollout engine {type(rollout).__name__} returned "
                          f"{reply.batch_size[0]} rows for {batch.batch_size[0]} prompts when "
                          "asked for one greedy reply each (remax's baseline)")
    for key in REPLY_FIELDS:
        batch.set(GREEDY_PREFIX + key, reply[key])
    metrics = {f"remax/baseline_{name}": value for name, value in (out.metrics or {}).items()
               if name.startswith("response_length/")}
    return NodeOutput(batch=batch, metrics=metrics)


def score_greedy_baseline(worker: Any, batch: Any) -> NodeOutput:
    held = [key for key in batch.keys() if str(key).startswith(GREEDY_PREFIX)]
    if not held:
        raise ConfigError("score_greedy_baseline found no greedy replies in its batch: it "
                          "runs after greedy_baseline_rollout (the remax workflow)")
    replies = batch.exclude(*held, *[k for k in REPLY_FIELDS if k in batch.keys()])
    for key in held:
        replies.set(key[len(GREEDY_PREFIX):], batch[key])
    scored = score_rows(worker.engines, replies)
    baselines = scored.batch[TOKEN_LEVEL_SCORES].sum(dim=-1)
    prompts = batch.exclude(*held)
    prompts.set(REWARD_BASELINES, baselines.float())
    metrics = {"remax/baseline_score/mean": baselines.float().mean()}
    if "reward/errors" in (scored.metrics or {}):  # greedy replies whose scoring failed
        metrics["remax/baseline_reward/errors"] = scored.metrics["reward/errors"]
    return NodeOutput(batch=prompts, metrics=metrics)
