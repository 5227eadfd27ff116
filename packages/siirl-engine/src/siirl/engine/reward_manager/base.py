"""What every reward manager shares: reading the batch, decoding, placing scores, metrics.

A subclass only decides *how* the score function is called (``_score_rows``); it
returns one entry per row, either the function's result or a ``Failure``. A failure
(the function raised, returned something that is not a number or a dict with "score",
or timed out) scores 0.0 and is logged here, in the parent process, so one bad sample
never costs the step. A ``siirl.errors.ConfigError`` (a data_source with no built-in
rule) is not a bad sample but a bad setup, and is raised.
"""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass
from itertools import compress
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    DATA_SOURCE,
    EXTRA_INFO,
    GROUND_TRUTH,
    OVERLONG_REWARD,
    RESPONSE_MASK,
    RESPONSES,
    REWARD_MODEL,
    SCORE,
    TOKEN_LEVEL_REWARDS,
    TOKEN_LEVEL_SCORES,
    UID,
)
from siirl.data_coordinator.protocol import get_non_tensor, set_non_tensor
from siirl.engine.common.config import typed_config
from siirl.engine.reward_manager.loader import custom_function_settings, load_custom_function
from siirl.engine.reward_manager.overlong import overlong_penalty
from siirl.engine.reward_score import default_compute_score
from siirl.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

# Rows whose failure is logged one by one per call; the rest are summarised, so a
# broken reward function does not flood the log with one line per sample.
_MAX_WARNINGS_PER_CALL = 10


@dataclass
class Failure:
    """A row whose score could not be computed; ``kind`` is "error" or "timeout"."""

    kind: str
    reason: str
    logged: bool = False  # the manager already warned (e.g. once for a whole batch call)


class RewardManagerBase(abc.ABC):
    """Built as ``Cls(role="reward", config=cfg, worker=dag_worker)`` by the plugin registry.

    ``tokenizer`` and ``compute_score`` may be given directly (tests, notebooks); otherwise
    the actor engine's tokenizer and ``custom_reward_function`` (or the built-in
    ``default_compute_score``) are used.
    """

    name = "base"
    peer_roles = ("actor",)  # its tokenizer decodes the responses (siirl.dag_worker.engines)

    def __init__(self, role: str = "reward", config: Any = None, worker: Any = None,
                 tokenizer: Any = None, compute_score: Optional[Callable[..., Any]] = None,
                 reward_kwargs: Optional[Dict[str, Any]] = None,
                 peers: Optional[Mapping[str, Any]] = None):
        self.role = role
        self.config = config
        self.worker = worker
        self._tokenizer = tokenizer
        self._actor = (peers or {}).get("actor")  # its tokenizer decodes the responses
        self.cfg = typed_config(config)  # read once; defaults are the schema's
        self.reward_fn_key = str(self.cfg.data.reward_fn_key or DATA_SOURCE)
        path, fn_name, kwargs, self.config_timeout_s = custom_function_settings(self.cfg)
        self.custom_path: Optional[str] = None
        self.custom_name = fn_name
        if compute_score is not None:
            self.compute_score = compute_score
        elif path:
            # Loaded here even for the parallel manager, so a wrong path or name fails
            # when the engine is built, not in a worker process mid-step.
            self.compute_score = load_custom_function(path, fn_name)
            self.custom_path = path
        else:
            self.compute_score = default_compute_score
        # reward_kwargs configure the user's function only, never the built-in rules.
        self.is_default = self.compute_score is default_compute_score
        self.reward_kwargs = dict(reward_kwargs if reward_kwargs is not None else kwargs)
        if self.is_default:
            self.reward_kwargs = {}

    # --- inputs ---

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = getattr(self._actor, "tokenizer", None)
            if self._tokenizer is None:
                raise ConfigError(f"reward manager '{self.name}' needs a tokenizer to decode "
                                  "responses: none was passed and no actor engine with a "
                                  "tokenizer was wired in")
        return self._tokenizer

    @staticmethod
    def response_mask(batch: Any) -> torch.Tensor:
        responses = batch.get(RESPONSES)
        mask = batch.get(RESPONSE_MASK, None)
        if mask is None:  # batches from older rollouts: the response part of attention_mask
            mask = batch.get(ATTENTION_MASK)[:, -responses.shape[1]:]
        return mask

    def decode(self, responses: torch.Tensor, mask: torch.Tensor) -> List[str]:
        """Each row's tokens where its mask is set, decoded in one tokenizer call.

        The ids leave the tensors once (``tolist``) and are filtered per row with
        ``itertools.compress``: the same ids as ``row[m > 0].tolist()``, without a tensor
        op per row. ``batch_decode`` decodes each sequence as ``decode`` would.
        """
        if responses.shape[0] == 0:  # batch_decode([]) would decode one empty sequence
            return []
        keep = (mask > 0).tolist()
        seqs = [list(compress(row, k)) for row, k in zip(responses.tolist(), keep, strict=True)]
        tokenizer = self.tokenizer
        batch_decode = getattr(tokenizer, "batch_decode", None)
        if batch_decode is None:  # minimal tokenizers (tests) have decode only
            return [tokenizer.decode(seq, skip_special_tokens=True) for seq in seqs]
        return list(batch_decode(seqs, skip_special_tokens=True))

    @staticmethod
    def _column(batch: Any, key: str, default: Any = DataError) -> list:
        if key in batch.keys():
            return get_non_tensor(batch, key)
        if default is DataError:
            raise DataError(f"the reward manager needs the per-row field '{key}'; batch "
                            f"fields: {', '.join(sorted(batch.keys()))}")
        return [default] * batch.batch_size[0]

    def _ground_truths(self, batch: Any) -> list:
        if GROUND_TRUTH in batch.keys():
            return get_non_tensor(batch, GROUND_TRUTH)
        if REWARD_MODEL in batch.keys():  # verl's dataset layout: {"ground_truth": ...}
            return [(rm or {}).get(GROUND_TRUTH) for rm in get_non_tensor(batch, REWARD_MODEL)]
        raise DataError("the reward manager needs the per-row field 'ground_truth' (or verl's "
                        f"'reward_model' dict); batch fields: {', '.join(sorted(batch.keys()))}")

    # --- scoring ---

    def call_one(self, fn: Callable[..., Any], data_source: Any, solution: str,
                 ground_truth: Any, extra_info: Any) -> Any:
        """One in-process call; an exception becomes a Failure (logged by the caller)."""
        try:
            return fn(data_source=data_source, solution_str=solution,
                      ground_truth=ground_truth, extra_info=extra_info, **self.reward_kwargs)
        except ConfigError:
            # e.g. a data_source with no built-in rule: every row would fail the same way,
            # so the run stops with the message saying what to configure.
            raise
        except Exception as exc:  # a user bug must cost the sample, not the step
            return Failure("error", f"{type(exc).__name__}: {exc}")

    def score_in_process(self, data_sources: list, solutions: List[str], ground_truths: list,
                         extra_infos: list) -> List[Any]:
        rows = zip(data_sources, solutions, ground_truths, extra_infos, strict=True)
        return [self.call_one(self.compute_score, *row) for row in rows]

    @abc.abstractmethod
    def _score_rows(self, data_sources: list, solutions: List[str], ground_truths: list,
                    extra_infos: list) -> List[Any]:
        """One result per row (a float, a dict with "score", or a Failure): how each
        manager (in process, batched, process pool) computes scores."""

    # --- outputs ---

    def _normalise(self, rows: Sequence[Any], data_sources: list
                   ) -> Tuple[List[float], List[Dict[str, Any]], Dict[str, int]]:
        scores, extras, counts = [], [], {"error": 0, "timeout": 0}
        warned = silenced = 0
        for i, result in enumerate(rows):
            if not isinstance(result, Failure):
                try:
                    scores.append(_as_score(result))
                    extras.append({k: v for k, v in result.items() if k != "score"}
                                  if isinstance(result, dict) else {})
                    continue
                except (TypeError, ValueError, KeyError) as exc:
                    result = Failure("error", f"bad return value {result!r}: {exc}")
            counts[result.kind] += 1
            scores.append(0.0)
            extras.append({})
            if result.logged:
                continue
            if warned < _MAX_WARNINGS_PER_CALL:
                warned += 1
                logger.warning("reward for row %d (data_source %r) failed, scored 0.0: %s",
                               i, data_sources[i], result.reason)
            else:
                silenced += 1
        if silenced:
            logger.warning("%d more reward rows failed and were scored 0.0", silenced)
        return scores, extras, counts

    def compute_reward(self, batch: Any) -> NodeOutput:
        responses = batch.get(RESPONSES)
        mask = self.response_mask(batch)
        data_sources = self._column(batch, self.reward_fn_key)
        ground_truths = self._ground_truths(batch)
        extra_infos = self._column(batch, EXTRA_INFO, None)
        solutions = self.decode(responses, mask)
        rows = self._score_rows(data_sources, solutions, ground_truths, extra_infos)
        scores, extras, counts = self._normalise(rows, data_sources)
        penalty = overlong_penalty(mask.sum(dim=-1).cpu(), self.cfg)
        rewards = scores if penalty is None else \
            [s + p for s, p in zip(scores, penalty.tolist(), strict=True)]

        token_scores = torch.zeros(responses.shape, dtype=torch.float32)
        if responses.shape[0] and responses.shape[1]:
            # Last position whose mask is 1 (flip + argmax); an all-zero row gets the last
            # position, as in verl, so its score still counts in sequence sums.
            last = mask.shape[1] - 1 - (mask.flip(1) > 0).to(torch.int8).argmax(dim=1)
            token_scores[torch.arange(len(scores)), last.cpu()] = torch.tensor(rewards)
        token_scores = token_scores.to(responses.device)
        # The node writes its fields into the batch it was handed (as the actor's log-prob
        # node does): a copy of a batch with per-row python fields costs more than scoring.
        out = batch
        out.set(TOKEN_LEVEL_SCORES, token_scores)
        out.set(TOKEN_LEVEL_REWARDS, token_scores.clone())
        set_non_tensor(out, SCORE, scores)
        # Extra result keys may not replace tensors or the columns the scores were read from.
        reserved = {k for k in out.keys() if isinstance(out.get(k), torch.Tensor)}
        reserved |= {SCORE, UID, self.reward_fn_key, GROUND_TRUTH, EXTRA_INFO, REWARD_MODEL}
        for key, values in _extra_columns(extras, reserved).items():
            set_non_tensor(out, key, values)
        metrics = self._metrics(scores, token_scores, data_sources, counts)
        if penalty is not None:
            set_non_tensor(out, OVERLONG_REWARD, penalty.tolist())
            metrics["reward/overlong_penalty/mean"] = penalty.mean().item() if \
                penalty.numel() else 0.0
            metrics["reward/overlong/ratio"] = (penalty < 0).float().mean().item() if \
                penalty.numel() else 0.0
        return NodeOutput(batch=out, metrics=metrics)

    def _metrics(self, scores: List[float], token_scores: torch.Tensor, data_sources: list,
                 counts: Dict[str, int]) -> Dict[str, float]:
        metrics: Dict[str, float] = {"reward/errors": float(counts["error"])}
        if scores:
            t = torch.tensor(scores, dtype=torch.float32)
            metrics.update({
                "critic/score/mean": t.mean().item(),
                "critic/score/max": t.max().item(),
                "critic/score/min": t.min().item(),
                "critic/rewards/mean": token_scores.sum(dim=-1).mean().item(),
            })
            by_source: Dict[str, List[float]] = {}
            for source, score in zip(data_sources, scores, strict=True):
                by_source.setdefault(str(source), []).append(score)
            for source, values in by_source.items():
                metrics[f"reward/{source}/mean"] = sum(values) / len(values)
        return metrics


def _as_score(result: Any) -> float:
    value = result["score"] if isinstance(result, dict) else result
    if isinstance(value, torch.Tensor):
        value = value.item()
    return float(value)


def _extra_columns(extras: List[Dict[str, Any]], reserved: set) -> Dict[str, list]:
    """Per-row columns for the extra keys of dict results.

    A row without a key (a failed row, or a scorer that returns it only sometimes) gets
    the "false" value of the key's type (False / 0 / 0.0), else None, so columns such as
    ``acc`` stay numeric for filters and metrics. Keys naming existing batch fields are
    dropped, never overwritten.
    """
    keys: List[str] = []
    for row in extras:
        keys.extend(k for k in row if k not in keys)
    columns: Dict[str, list] = {}
    for key in keys:
        if key in reserved:
            logger.warning("reward result key %r names an existing batch field; ignored", key)
            continue
        sample = next(row[key] for row in extras if key in row)
        fill = type(sample)() if isinstance(sample, (bool, int, float)) else None
        columns[key] = [row.get(key, fill) for row in extras]
    return columns
