"""What every reward manager shares: reading the batch, decoding, placing scores, metrics.

A subclass only decides *how* the score function is called (``_score_rows``); it
returns one ``outcome.Scored`` or ``outcome.Failure`` per row. A failure scores 0.0, is
counted by kind and warned about once (``failures``), so one bad sample never costs the
step. A ``siirl.errors.ConfigError`` (a data_source with no built-in rule) is not a bad
sample but a bad setup, and is raised.

Containment: the user's function (``custom_reward_function.path``) runs in persistent
worker processes (``_pool``) under every manager, with a per-call timeout ``timeout_s``
(``custom_reward_function.reward_kwargs.timeout_s``, else the manager's default) and a
per-step budget (``reward_model.step_timeout_s``). The built-in rules and a function
object handed to the constructor (tests, notebooks) run in this process: their
exceptions and bad results are contained, an exit or a hang is not.

With a reward model (``reward_model.enable``) the batch carries ``rm_scores``; each row's
score is then its rule score plus ``reward_model.rm_weight`` times the model's, and rows no
rule knows get the model's alone (``siirl.engine.reward_model.combine``).
"""

from __future__ import annotations

import abc
import time
from itertools import compress
from typing import Any, Callable, Dict, List, Mapping, Optional

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
from siirl.engine.reward_manager._pool import RewardWorkerPool, Target
from siirl.engine.reward_manager.columns import extra_columns, score_metrics, token_level
from siirl.engine.reward_manager.failures import FailureLog, RewardFunctionError
from siirl.engine.reward_manager.loader import custom_function_settings
from siirl.engine.reward_manager.outcome import Outcome, Row, call_row
from siirl.engine.reward_manager.overlong import overlong_penalty
from siirl.engine.reward_model import combine
from siirl.engine.reward_score import default_compute_score
from siirl.errors import ConfigError, DataError


class RewardManagerBase(abc.ABC):
    """Built as ``Cls(role="reward", config=cfg, worker=dag_worker)`` by the plugin registry.

    ``tokenizer`` and ``compute_score`` may be given directly (tests, notebooks); otherwise
    the actor engine's tokenizer and ``custom_reward_function`` (or the built-in
    ``default_compute_score``) are used. ``timeout_s`` overrides the configured per-call
    timeout.
    """

    name = "base"
    peer_roles = ("actor",)  # its tokenizer decodes the responses (siirl.dag_worker.walk.engines)
    default_timeout_s = 10.0  # per call; a call scores one sample here
    num_workers = 1

    def __init__(self, role: str = "reward", config: Any = None, worker: Any = None,
                 tokenizer: Any = None, compute_score: Optional[Callable[..., Any]] = None,
                 reward_kwargs: Optional[Dict[str, Any]] = None,
                 peers: Optional[Mapping[str, Any]] = None, timeout_s: Optional[float] = None):
        self.role = role
        self.config = config
        self.worker = worker
        self._tokenizer = tokenizer
        self._actor = (peers or {}).get("actor")  # its tokenizer decodes the responses
        self.cfg = typed_config(config)  # read once; defaults are the schema's
        self.reward_fn_key = str(self.cfg.data.reward_fn_key or DATA_SOURCE)
        path, fn_name, kwargs, config_timeout_s = custom_function_settings(self.cfg)
        self.custom_path: Optional[str] = None
        self.custom_name = fn_name
        if compute_score is not None:
            self.compute_score = compute_score
        elif path:
            self.compute_score = None  # user code from a file runs in worker processes only
            self.custom_path = path
        else:
            self.compute_score = default_compute_score
        # reward_kwargs configure the user's function only, never the built-in rules.
        self.is_default = self.compute_score is default_compute_score
        self.reward_kwargs = dict(reward_kwargs if reward_kwargs is not None else kwargs)
        if self.is_default:
            self.reward_kwargs = {}
        if timeout_s is None:
            timeout_s = config_timeout_s if config_timeout_s is not None \
                else self.default_timeout_s
        self.timeout_s = float(timeout_s)
        self.step_timeout_s = float(self.cfg.reward_model.step_timeout_s)
        for key, value in (("custom_reward_function.reward_kwargs.timeout_s", self.timeout_s),
                           ("reward_model.step_timeout_s", self.step_timeout_s)):
            if not value > 0:  # also refuses nan
                raise ConfigError(f"{key}={value:g} must be > 0 (seconds)")
        self.failures = FailureLog(self.function_label())
        self._pool: Optional[RewardWorkerPool] = None
        self._retried = 0  # samples of failed batch calls scored again (this call)
        if self.custom_path:
            # a file that does not import, or lacks the function, fails when the engine
            # is built, not mid-step (the worker loads it; this process never runs it)
            self.pool.start()

    def function_label(self) -> str:
        """How messages name the reward function."""
        if self.custom_path:
            return f"'{self.custom_name}' in {self.custom_path}"
        if self.is_default:
            return "default_compute_score (the built-in rules)"
        fn = self.compute_score
        return f"'{getattr(fn, '__qualname__', fn)}' ({getattr(fn, '__module__', '?')})"

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

    def worker_target(self) -> Target:
        """What the worker processes run (see ``_pool.Target``)."""
        if self.is_default:
            return ("default",)
        if self.custom_path:
            # Workers import the file themselves: functions from a file loaded by path
            # cannot be pickled by reference.
            return ("path", self.custom_path, self.custom_name, self.reward_kwargs)
        return ("callable", self.compute_score, self.reward_kwargs)

    @property
    def pool(self) -> RewardWorkerPool:
        """The worker processes, started on first use."""
        if self._pool is None:
            self._pool = RewardWorkerPool(self.worker_target(), self.num_workers,
                                          self.timeout_s)
        return self._pool

    def score_in_process(self, rows: List[Row]) -> List[Outcome]:
        return [call_row(self.compute_score, row, self.reward_kwargs) for row in rows]

    @abc.abstractmethod
    def _score_rows(self, rows: List[Row], deadline: float) -> List[Outcome]:
        """One outcome per row ``(data_source, solution, ground_truth, extra_info)``, by
        ``deadline`` (``time.monotonic()``) where the manager can enforce it."""

    # --- outputs ---

    def compute_reward(self, batch: Any) -> NodeOutput:
        responses = batch.get(RESPONSES)
        mask = self.response_mask(batch)
        data_sources = self._column(batch, self.reward_fn_key)
        ground_truths = self._ground_truths(batch)
        extra_infos = self._column(batch, EXTRA_INFO, None)
        solutions = self.decode(responses, mask)
        rows = list(zip(data_sources, solutions, ground_truths, extra_infos, strict=True))
        self._retried = 0
        ruled = combine.rows_with_rules(self, data_sources)  # None: no reward model
        outcomes = self._score_rows(combine.only(rows, ruled),
                                    time.monotonic() + self.step_timeout_s)
        outcomes = combine.expand(outcomes, ruled)
        scores, extras, counts = self.failures.split(outcomes, data_sources)
        model = combine.model_scores(batch)  # the reward_model engine's, this step
        rule_metrics = {}
        if model is not None:
            scores, rule_metrics = combine.add_model_scores(
                scores, ruled, model, float(self.cfg.reward_model.rm_weight))
        penalty = overlong_penalty(mask.sum(dim=-1).cpu(), self.cfg)
        rewards = scores if penalty is None else \
            [s + p for s, p in zip(scores, penalty.tolist(), strict=True)]
        token_scores = token_level(rewards, responses, mask)
        # The node writes its fields into the batch it was handed (as the actor's log-prob
        # node does): a copy of a batch with per-row python fields costs more than scoring.
        out = batch
        out.set(TOKEN_LEVEL_SCORES, token_scores)
        out.set(TOKEN_LEVEL_REWARDS, token_scores.clone())
        set_non_tensor(out, SCORE, scores)
        # Extra result keys may not replace tensors or the columns the scores were read from.
        reserved = {k for k in out.keys() if isinstance(out.get(k), torch.Tensor)}
        reserved |= {SCORE, UID, self.reward_fn_key, GROUND_TRUTH, EXTRA_INFO, REWARD_MODEL}
        for key, values in extra_columns(extras, reserved).items():
            set_non_tensor(out, key, values)
        metrics = self.failures.metrics(counts, len(rows), self._retried)
        metrics.update(score_metrics(scores, token_scores, data_sources))
        metrics.update(rule_metrics)
        if penalty is not None:
            set_non_tensor(out, OVERLONG_REWARD, penalty.tolist())
            metrics["reward/overlong_penalty/mean"] = penalty.mean().item() if \
                penalty.numel() else 0.0
            metrics["reward/overlong/ratio"] = (penalty < 0).float().mean().item() if \
                penalty.numel() else 0.0
        return NodeOutput(batch=out, metrics=metrics)

    def failed_steps_error(self, steps: int) -> RewardFunctionError:
        """Read by the trainer after ``reward_model.max_failed_steps`` steps in which every
        sample failed: the error that stops the run, naming the function and last error."""
        return self.failures.failed_steps_error(steps)

    def close(self) -> None:
        """Stop the worker processes (also done at exit)."""
        if self._pool is not None:
            self._pool.close()
