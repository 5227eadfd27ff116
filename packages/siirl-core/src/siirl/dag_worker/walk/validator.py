"""Validation: rollout over the validation set (decoded as ``rollout.val_kwargs`` say),
scored by the reward engine; with ``trainer.val_greedy_and_sampled`` a second decoding too."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict

from siirl.dag_worker.walk import generations
from siirl.data_coordinator.fields import (
    COMPLETE,
    DATA_SOURCE,
    RESPONSE_MASK,
    TOKEN_LEVEL_SCORES,
)
from siirl.data_coordinator.protocol import get_non_tensor
from siirl.errors import ConfigError

DECODINGS = ("greedy", "sampled")  # the metric prefixes of trainer.val_greedy_and_sampled


def val_kwargs_decoding(config: Any) -> str:
    """``greedy`` or ``sampled``: how ``rollout.val_kwargs`` decode (as the rollouts read
    them: greedy unless ``do_sample`` with a positive temperature)."""
    val_kwargs = config.actor_rollout_ref.rollout.val_kwargs
    sampled = bool(val_kwargs.do_sample) and float(val_kwargs.temperature or 0.0) > 0.0
    return "sampled" if sampled else "greedy"


def validate(worker: Any, val_loader: Any) -> Dict[str, float]:
    """``val/score/mean`` over every validation sample and ``val/<data_source>/score/mean``;
    with rows that say whether their task succeeded (``complete``, e.g. the AGENTIC
    workflow's episodes), ``val/success_rate`` and ``val/<data_source>/success_rate`` too.

    Each worker validates its share of the set; the per-row results of all workers are
    combined, so the metrics are those of the whole set on any number of workers. A graph
    whose rollout node scores its own rows (``worker.scored_rollout()``) is validated
    through that node; otherwise the rollout engine generates and the reward engine scores.

    With ``trainer.val_greedy_and_sampled`` the set is played twice: as ``val_kwargs`` say
    (the ``val/...`` metrics, unchanged) and with the other decoding, and each pass's
    metrics are also written under its decoding's name, ``val/greedy/...`` and
    ``val/sampled/...`` (sampled: at ``val_kwargs``' temperature when they sample, else at
    the training rollout's).
    """
    sync = getattr(worker, "sync_rollout_weights", None)
    if sync is not None:  # a resumed run may validate before its first step
        sync()
    batches = list(val_loader)
    if not getattr(worker.config.trainer, "val_greedy_and_sampled", False):
        return _validate_once(worker, batches, report=True)
    own = val_kwargs_decoding(worker.config)
    other = DECODINGS[1 - DECODINGS.index(own)]
    rollout = worker.engines.get("rollout")
    if not hasattr(rollout, "overridden"):
        raise ConfigError(
            f"trainer.val_greedy_and_sampled=true, but the rollout engine "
            f"{type(rollout).__name__} cannot switch its decoding (it has no "
            "overridden(val_sampled=...)); set trainer.val_greedy_and_sampled=false")
    # the other decoding first: the val_kwargs pass last leaves its dumps and videos
    with rollout.overridden(val_sampled=other == "sampled"):
        extra = _validate_once(worker, batches, report=False)
    metrics = _validate_once(worker, batches, report=True)
    for name, values in ((own, dict(metrics)), (other, extra)):
        metrics.update({f"val/{name}/{key[len('val/'):]}": value
                        for key, value in values.items()})
    return metrics


def _validate_once(worker: Any, batches: list, report: bool) -> Dict[str, float]:
    """One pass over ``batches``; ``report``: write and print the generations as asked."""
    rollout = worker.engines.get("rollout")
    reward = worker.engines.get("reward")
    scored_rollout = getattr(worker, "scored_rollout", lambda: None)()

    def generate_and_score(batch: Any) -> Any:
        if scored_rollout is not None:
            return scored_rollout(batch).batch
        return reward.compute_reward(rollout.generate(batch, validate=True).batch).batch

    rows = []  # (data_source, score, response length, success or None)
    comm = getattr(worker, "comm", None)
    if comm is not None and comm.active:
        # Generation gathers sharded weights (a collective): every worker must call it as
        # often as the others, so one whose share ran out repeats a discarded 1-row batch.
        most = max(comm.all_gather(len(batches)))
        for _ in range(most - len(batches) if batches else 0):
            if scored_rollout is not None:
                scored_rollout(batches[0][:1])
            else:
                rollout.generate(batches[0][:1], validate=True)
    texts = []  # the generations, when validation_data_dir / log_val_generations want them
    trainer = worker.config.trainer
    folder, shown = trainer.validation_data_dir, trainer.log_val_generations or 0
    folder, shown = (folder, shown) if report else (None, 0)
    for batch in batches:
        scored = generate_and_score(batch)
        if folder or shown:
            texts += generations.lines(scored, getattr(worker, "tokenizer", None))
        scores = scored[TOKEN_LEVEL_SCORES].sum(dim=-1).tolist()
        lengths = scored[RESPONSE_MASK].sum(dim=-1).tolist()
        success = scored[COMPLETE].tolist() if COMPLETE in scored.keys() else \
            [None] * len(scores)
        rows.extend(zip(get_non_tensor(scored, DATA_SOURCE), scores, lengths, success,
                        strict=True))
    step = int(getattr(worker, "global_step", 0) or 0)
    rank, world = (comm.rank, comm.world_size) if comm is not None else (0, 1)
    if folder and getattr(worker, "is_data_source", True):
        generations.dump(texts, folder, step, rank, world)
    if shown and rank == 0:
        for line in texts[:shown]:
            print(f"step {step}: val sample (score {line['score']}): {line['input']!r} -> "
                  f"{line['output']!r}", flush=True)
    if comm is not None:
        # tensor-parallel peers validated copies of the same rows: count them once
        rows = rows if getattr(worker, "is_data_source", True) else []
        rows = [row for part in comm.all_gather(rows) for row in part]
    by_source: Dict[str, list] = defaultdict(list)
    successes: Dict[str, list] = defaultdict(list)
    for source, score, _, success in rows:
        by_source[source].append(score)
        if success is not None:
            successes[source].append(float(success))
    lengths = [row[2] for row in rows]
    all_scores = [s for scores in by_source.values() for s in scores]
    if not all_scores:
        return {}
    metrics = {"val/score/mean": sum(all_scores) / len(all_scores),
               "val/response_length/mean": sum(lengths) / len(lengths)}
    for source, scores in by_source.items():
        metrics[f"val/{source}/score/mean"] = sum(scores) / len(scores)
    every = [s for values in successes.values() for s in values]
    if every:
        metrics["val/success_rate"] = sum(every) / len(every)
        for source, values in successes.items():
            metrics[f"val/{source}/success_rate"] = sum(values) / len(values)
    return metrics
