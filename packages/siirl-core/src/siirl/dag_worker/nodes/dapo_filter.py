"""DAPO dynamic sampling: drop prompt groups whose metric has zero variance, and generate
again until the step has a full batch of informative groups.

Such a group (all samples right, or all wrong) has zero GRPO advantage and only dilutes
the batch. ``algorithm.filter_groups.metric`` picks the value (``acc``, ``score``, ...; see
``group_filter.row_values``; default ``seq_final_reward``). With ``filter_groups.enable``:

* kept groups are pooled for the step (``worker.step_state``); ``dynamic_sampling/total``
  and ``/kept`` count the last generation batch's groups, ``dynamic_sampling/step_groups/
  total`` and ``/kept`` all generation batches of the step (``num_gen_batches`` of them);
* while the pool holds fewer than this worker's share of ``data.train_batch_size`` prompt
  groups, the node asks the worker to regenerate: the graph restarts on the next batch of
  the dataloader (``data.gen_batch_size`` prompts per round, as in verl;
  ``info={"regenerate": True}``). All workers decide together (the smallest pool counts),
  so they regenerate in step;
* once enough, the pool is cut to exactly that many groups (in generation order);
* after ``filter_groups.max_num_gen_batches`` generations (<= 0: no limit) without enough
  groups, ``filter_groups.on_exhausted=error`` (default, as verl) stops with an error,
  ``warn`` trains on the groups collected (the same count on every worker).

With ``enable=false`` the batch passes through unchanged, metrics still reported.
"""

from __future__ import annotations

import logging

from siirl.dag_worker.data_structures import NodeOutput
from siirl.dag_worker.nodes.group_filter import filter_groups, row_values
from siirl.data_coordinator.fields import ATTENTION_MASK, INPUT_IDS, POSITION_IDS, PROMPTS
from siirl.data_coordinator.protocol import concat_left_padded, group_indices, select_rows
from siirl.errors import ConfigError, DataError
from siirl.params.typed import to_typed

logger = logging.getLogger(__name__)
_CFG = "algorithm.filter_groups"
_POOL, _GENS = "dapo/pool", "dapo/num_gen_batches"
_TOTALS = "dapo/step_groups"  # groups generated and kept over the step's generation batches


def has_variance(group_values) -> bool:
    # A group of one sample carries no variance information; keep it, as verl does.
    return group_values.numel() == 1 or bool(group_values.std() > 0)


def _first_groups(batch, count: int):
    groups = list(group_indices(batch).values())[:count]
    return select_rows(batch, [row for rows in groups for row in rows])


def _merge(parts, worker):
    """One batch of the pooled parts; prompts of different batches have different padded
    widths, so prompt-side fields are left-padded to a common width first."""
    if len(parts) == 1:
        return parts[0]
    pad_id = getattr(getattr(worker, "tokenizer", None), "pad_token_id", None) or 0
    return concat_left_padded(parts, {INPUT_IDS: pad_id, PROMPTS: pad_id,
                                      ATTENTION_MASK: 0, POSITION_IDS: 0})


def _target_groups(worker, config) -> int:
    """This worker's share of data.train_batch_size (a generation round's loader batch is
    its share of data.gen_batch_size)."""
    loader = getattr(worker, "train_loader", None)
    return config.data.train_batch_size // int(getattr(loader, "num_ranks", 1) or 1)


def dynamic_sampling(batch, config=None, **kwargs) -> NodeOutput:
    config = to_typed(config)  # the worker's typed config; a dict or None when called alone
    settings = config.algorithm.filter_groups
    metric = settings.metric or "seq_final_reward"
    filtered, stats = filter_groups(batch, row_values(batch, metric), has_variance)
    metrics = {f"dynamic_sampling/{k.split('/')[-1]}": v for k, v in stats.items()}
    worker = kwargs.get("worker")
    if not settings.enable:
        return NodeOutput(batch=batch, metrics=metrics)
    if worker is None:  # called outside a worker: a plain filter
        return NodeOutput(batch=filtered, metrics=metrics)
    state = worker.step_state
    state.setdefault(_POOL, []).append(filtered)
    state[_GENS] = state.get(_GENS, 0) + 1
    totals = state.setdefault(_TOTALS, {"total": 0.0, "kept": 0.0})
    totals["total"] += stats["groups/total"]
    totals["kept"] += stats["groups/kept"]
    pool = _merge(state[_POOL], worker)
    state[_POOL] = [pool]
    have = len(group_indices(pool))
    target = _target_groups(worker, config)
    fewest = min(worker.comm.all_gather(have))  # every worker takes the same decision
    metrics["dynamic_sampling/num_gen_batches"] = float(state[_GENS])
    # the per-batch keys above describe the last generation batch; these the whole step
    metrics.update({f"dynamic_sampling/step_groups/{k}": v for k, v in totals.items()})
    if fewest >= target:
        return NodeOutput(batch=_first_groups(pool, target), metrics=metrics)
    limit = settings.max_num_gen_batches or 0
    if limit <= 0 or state[_GENS] < limit:
        return NodeOutput(batch=None, metrics=metrics, info={"regenerate": True})
    action = settings.on_exhausted
    message = (f"DAPO dynamic sampling: {state[_GENS]} generation batches "
               f"({_CFG}.max_num_gen_batches={limit}) gave {fewest} prompt groups with "
               f"non-zero '{metric}' variance on the poorest worker, fewer than the {target} "
               "needed; the data may be too easy or too hard for the model, raise "
               f"{_CFG}.max_num_gen_batches, or set {_CFG}.on_exhausted=warn")
    if action == "warn" and fewest > 0:
        logger.warning("%s; training on %d groups", message, fewest)
        return NodeOutput(batch=_first_groups(pool, fewest), metrics=metrics)
    if action not in ("error", "warn"):
        raise ConfigError(f"{_CFG}.on_exhausted={action!r}: choose error or warn")
    raise DataError(message)
